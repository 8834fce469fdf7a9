"""`rldojo check-env ID`: check that an environment keeps the `Env` contract.

Runs `rldojo.envs.check.check_env` on a registered id or a ``package.module:factory``
path and prints one line per check. Exit status: 0 when every check passes, 1 when one
fails, 2 for bad input (unknown id, invalid ``--kwargs`` JSON).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("check-env")(check_env_command)


def check_env_command(
    env_id: Annotated[str, typer.Argument(help="Environment id or package.module:factory")],
    kwargs: Annotated[
        str, typer.Option("--kwargs", help="Factory keyword arguments as a JSON object")
    ] = "{}",
    seed: Annotated[int, typer.Option(help="Task and reset seed")] = 0,
    timeout_s: Annotated[float, typer.Option(help="Time limit of each check")] = 60.0,
) -> None:
    """Check an environment: determinism, snapshot/restore, bad actions, step after done."""
    from rich.markup import escape

    from rldojo.cli import console, fail
    from rldojo.envs.check import check_env
    from rldojo.envs.registry import list_envs

    try:
        env_kwargs = json.loads(kwargs)
    except json.JSONDecodeError as exc:
        fail(f"--kwargs is not valid JSON: {exc}")
        return
    if not isinstance(env_kwargs, dict):
        fail("--kwargs must be a JSON object")
        return
    if ":" not in env_id and env_id not in list_envs():
        fail(f"unknown environment {env_id!r}; known: {', '.join(list_envs())}")
        return
    report = check_env(env_id, seed=seed, timeout_s=timeout_s, **env_kwargs)
    for result in report.results:
        mark = "[green]ok[/]" if result.passed else "[red]FAIL[/]"
        console.print(f"{mark} {result.name}: {escape(result.message)}", soft_wrap=True)
    verdict = "[green]PASS[/]" if report.ok else f"[red]FAIL[/] ({len(report.failures)} failed)"
    console.print(f"check-env {escape(env_id)}: {verdict}")
    if not report.ok:
        raise typer.Exit(1)
