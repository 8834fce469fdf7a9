"""What runs inside a job's worker process: one rldojo training run in the job's run dir.

`run_job(config_toml, run_dir)` is called by the scheduler through `rldojo.workers`
(a fresh interpreter in its own process group, which dies with the service). A run
directory that already holds `config.toml` is resumed from its newest checkpoint (a job
re-queued after a restart, or resumed after a pause); the ledger means graded rollouts
are not redone. The trainer's console goes to `RUN/train.log`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

__all__ = ["run_job", "trained_tokens"]


def trained_tokens(run_dir: Path) -> int:
    """Completion tokens of the rollouts the job trained on (OpenAI's `trained_tokens`)."""
    import sqlite3

    path = run_dir / "ledger.sqlite"
    if not path.exists():
        return 0
    db = sqlite3.connect(path)
    try:
        row = db.execute(
            "SELECT SUM(json_array_length(completion_ids)) FROM rollouts WHERE trained > 0"
        ).fetchone()
        return int(row[0] or 0)
    except sqlite3.Error:
        return 0
    finally:
        db.close()


def run_job(config_toml: str, run_dir: str) -> dict[str, Any]:
    """Train (or resume) the job; returns the run's summary."""
    from rich.console import Console

    from rldojo.config import load_config
    from rldojo.train.loop import run_training

    run = Path(run_dir)
    resume = (run / "config.toml").exists()
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_toml)
    config = load_config(f.name)
    Path(f.name).unlink()
    run.mkdir(parents=True, exist_ok=True)
    with (run / "train.log").open("a") as log:
        console = Console(file=log, width=120, force_terminal=False)
        summary = run_training(config, run_dir=run, resume=resume, console=console)
    return {
        k: v
        for k, v in summary.items()
        if k in ("steps", "wall_s", "mean_step_s", "rollouts", "rollouts_trained")
    }
