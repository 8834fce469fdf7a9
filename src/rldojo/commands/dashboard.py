"""`rldojo dashboard`: the browser dashboard over run directories (see `rldojo.dashboard`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rldojo.dashboard.server import DashboardHandle


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)


def dashboard(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(help="Run directories or folders of runs (default: ./runs)"),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to bind (no auth: keep it on loopback)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port)")] = 8080,
) -> None:
    """Runs, charts per step, the rollout viewer (forking tokens outlined), reports."""
    from rldojo.commands.ui import console, fail

    roots = runs or [Path("runs")]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        fail(f"not a directory: {', '.join(missing)} (give run directories or their folder)")
    from rldojo.asgi import run_until_stopped
    from rldojo.dashboard.server import start_dashboard

    def ready(handle: DashboardHandle) -> None:
        console.print(
            f"rldojo dashboard at {handle.url} over {', '.join(map(str, roots))} (Ctrl-C stops)",
            soft_wrap=True,
        )

    run_until_stopped(start_dashboard(roots, host, port), ready)
