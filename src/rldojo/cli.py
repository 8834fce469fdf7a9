"""The `rldojo` command line: train | eval | envs | doctor.

Every command turns bad input into a one-line error and exit code 2 (config errors name
the file and key; data errors name the file, line and field), never a traceback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rldojo.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()


def _fail(message: str) -> None:
    console.print(f"[red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(2)


def _user_errors() -> tuple[type[Exception], ...]:
    from rldojo.data.loading import DataError
    from rldojo.envs.registry import UnknownEnvError
    from rldojo.policy.models import ModelLoadError

    return (ConfigError, DataError, UnknownEnvError, ModelLoadError)


@app.command()
def train(
    config: Annotated[
        Path | None, typer.Argument(help="TOML config (default: the quickstart)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. loss.rho=1.0")
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="Resume the run in this directory")] = None,
) -> None:
    """Train a policy with forking-token GRPO (default: SmolLM2-135M on arith-v1)."""
    from rldojo.train.loop import run_training

    try:
        if resume is not None:
            base = config or resume / "config.toml"
            cfg = load_config(base, set_ or [])
            run_training(cfg, run_dir=resume, resume=True, console=console)
        else:
            cfg = load_config(config, set_ or [])
            run_training(cfg, console=console)
    except _user_errors() as exc:
        _fail(str(exc))


@app.command("eval")
def eval_(
    model: Annotated[
        str, typer.Option(help="Model name, directory or checkpoint")
    ] = "smollm2-135m-instruct",
    env: Annotated[str, typer.Option(help="Environment id")] = "arith-v1",
    tasks: Annotated[int, typer.Option(help="Held-out tasks")] = 128,
    max_new_tokens: Annotated[int, typer.Option()] = 48,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path | None, typer.Option(help="Write per-task results as JSON")] = None,
) -> None:
    """Greedy held-out accuracy of a model on an environment's test split."""
    from rldojo.envs.registry import make_env
    from rldojo.eval.harness import evaluate
    from rldojo.policy.models import load_model
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.types import SamplingParams

    try:
        environment = make_env(env)
        grader = environment.default_grader()
        test = list(environment.tasks("test", seed=seed, n=tasks))[:tasks]
        m, tok = load_model(model)
        policy = TransformersPolicy(m, tok)
        result = asyncio.run(
            evaluate(
                lambda: make_env(env),
                grader,
                policy,
                test,
                SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
                seed=seed,
            )
        )
    except _user_errors() as exc:
        _fail(str(exc))
        return
    lo, hi = result.ci95
    console.print(
        f"{model} on {env}: accuracy {result.accuracy:.1%} (n={result.n}, 95% CI "
        f"{lo:.1%}-{hi:.1%}), mean reward {result.mean_reward:.3f}, statuses {result.statuses}"
    )
    if out is not None:
        out.write_text(
            json.dumps(
                {"accuracy": result.accuracy, "ci95": result.ci95, "rows": result.rows}, indent=2
            )
        )


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
    import torch

    rows.append(
        (
            "backend transformers",
            "ok",
            f"cpu threads={torch.get_num_threads()}"
            + (", cuda" if torch.cuda.is_available() else ""),
        )
    )
    rows.append(
        ("backend vllm", "ok" if importlib.util.find_spec("vllm") else "missing", "GPU path")
    )
    rows.append(_sandbox_row())
    return rows


def _sandbox_row() -> tuple[str, str, str]:
    try:
        from rldojo import sandbox

        probe: Any = sandbox.probe()  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        return ("sandbox", "missing", "rldojo.sandbox not available")
    except Exception as exc:
        return ("sandbox", "error", str(exc))
    ok = bool(getattr(probe, "strict", getattr(probe, "ok", False)))
    return ("sandbox", "ok" if ok else "weak", str(getattr(probe, "summary", probe)))


@app.command()
def doctor() -> None:
    """What is installed, which backends and sandboxes work."""
    table = Table(title="rldojo doctor")
    for col in ("component", "status", "detail"):
        table.add_column(col)
    for name, status, detail in _doctor_rows():
        colour = {"ok": "green", "missing": "yellow"}.get(status, "red")
        table.add_row(name, f"[{colour}]{status}[/]", detail)
    console.print(table)
    console.print(f"cache: {os.environ.get('RLDOJO_CACHE', '~/.cache/rldojo')}")


if __name__ == "__main__":
    app()
