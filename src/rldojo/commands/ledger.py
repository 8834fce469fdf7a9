"""`rldojo ledger`: inspect a run's ledger and export it to Parquet for analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ledger_app = typer.Typer(help="Inspect or export a run's rollout ledger.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(ledger_app, name="ledger")


def _open(run: Path):
    from rldojo.commands.ui import fail
    from rldojo.store.ledger import Ledger

    path = run / "ledger.sqlite" if run.is_dir() else run
    if not path.exists():
        fail(f"{path}: no ledger here (expected RUN_DIR/ledger.sqlite)")
    return Ledger(path)


@ledger_app.command("export")
def export(
    run: Annotated[Path, typer.Argument(help="Run directory or ledger.sqlite")],
    out: Annotated[Path, typer.Option(help="Parquet file to write")] = Path("ledger.parquet"),
) -> None:
    """Write every rollout (tokens, mask, logprobs, score, status) to a Parquet file."""
    from rldojo.commands.ui import console

    ledger = _open(run)
    try:
        n = ledger.export_parquet(out)
    finally:
        ledger.close()
    console.print(f"wrote {n} rollouts to {out}")


@ledger_app.command("stats")
def stats(run: Annotated[Path, typer.Argument(help="Run directory or ledger.sqlite")]) -> None:
    """Rollout counts by rollout/score status, and how many were trained on."""
    from rldojo.commands.ui import console

    ledger = _open(run)
    try:
        console.print(f"rollouts: {ledger.count()} (trained on: {ledger.count(trained=True)})")
        for key, n in sorted(ledger.status_counts().items()):
            console.print(f"  {key}: {n}")
    finally:
        ledger.close()
