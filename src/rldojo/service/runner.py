"""What runs inside a job's worker process: one rldojo run in the job's run dir.

The scheduler calls these through `rldojo.workers` (a fresh interpreter in its own
process group, which dies with the service); the console goes to `RUN/train.log`.

`run_job(config_toml, run_dir, judge_api_key)`: a reinforcement job,
`rldojo.training.loop.run_training`; the judge key (`--judge-api-key`) arrives as an
argument and goes into the worker's environment, never into `config.toml`.
A run directory that already holds `config.toml` is resumed from its newest checkpoint
(a job re-queued after a restart, or resumed after a pause); the ledger means graded
rollouts are not redone.

Both write what a person waits through to `RUN/progress.jsonl` (`JobPhases`: loading the
model, the model's one-time conversion, evaluations under way, the run's messages),
which the service turns into job events (`rldojo.service.watch`).

`run_sft_job(config_toml, run_dir, name, validation)`: a supervised job,
`rldojo.training.sft.run_sft` on `sft.data`, in the same run loop: a run directory that
already holds `config.toml` is resumed from its newest checkpoint (a pause saves one), so
a paused or re-queued supervised job goes on from where it stopped. With a
validation file (`(path, name)`), the trained model's loss on it is written to
`RUN/validation.json` (`rldojo.service.sft_data.validation_loss`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rldojo.report.progress import plain_due
from rldojo.service.watch import PROGRESS
from rldojo.training.callbacks import Callback

__all__ = [
    "JobPhases",
    "config_of",
    "run_job",
    "run_sft_job",
    "trained_tokens",
    "use_judge_key",
]

VALIDATION = "validation.json"


class JobPhases(Callback):
    """A run's phases as lines of `RUN/progress.jsonl` (`{"message": ...}`), each a job
    event: the run starting, its messages, each evaluation at its start and halfway."""

    def __init__(self, run_dir: Path, shown_as: dict[str, str] | None = None) -> None:
        """`shown_as`: text to replace in each line (a stored file's path by its name)."""
        self.path = run_dir / PROGRESS
        self.shown_as = shown_as or {}
        self._said: dict[str, int] = {}  # by evaluation label (each evaluated once a run)

    def write(self, message: str) -> None:
        """Append a line (after a line a killed worker left unfinished: on a line of its own)."""
        for text, shown in self.shown_as.items():
            message = message.replace(text, shown)
        with self.path.open("ab+") as f:  # appends at the end wherever it reads
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - 1, 0))
            torn = size > 0 and f.read(1) != b"\n"
            f.write(b"\n" * torn + json.dumps({"message": message}).encode() + b"\n")

    def on_start(self, info: dict[str, Any]) -> None:
        step, total = int(info.get("step", 0)), int(info.get("total_steps", 0))
        where = f"from step {step + 1} of {total}" if step else f"{total} steps"
        self.write(f"Model and data loaded: training {where}")

    def on_message(self, line: str) -> None:
        self.write(line)

    def on_eval_progress(self, label: str, done: int, total: int) -> None:
        if done < total and plain_due(done, total, self._said.get(label), parts=2):
            self._said[label] = done
            self.write(f"Evaluating {label}: {done}/{total} tasks")


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


def config_of(config_toml: str) -> Any:
    """The `TrainConfig` of a job's `config.toml` text."""
    from rldojo.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_toml)
    try:
        return load_config(f.name)
    finally:
        Path(f.name).unlink()


def use_judge_key(judge_api_key: str | None) -> None:
    """Put the judge key into this worker's environment, where the loader reads it."""
    from rldojo.service.judge import JUDGE_KEY_ENV

    if judge_api_key:
        os.environ[JUDGE_KEY_ENV] = judge_api_key


def run_job(config_toml: str, run_dir: str, judge_api_key: str | None = None) -> dict[str, Any]:
    """Train (or resume) the reinforcement job; returns the run's summary. `judge_api_key`
    goes into this worker's environment (`RLDOJO_JUDGE_API_KEY`), where the judge table
    of the config's grader spec says to read it (and the processes it starts inherit it)."""
    from rich.console import Console

    from rldojo.training.loop import run_training

    use_judge_key(judge_api_key)
    run = Path(run_dir)
    resume = (run / "config.toml").exists()
    config = config_of(config_toml)
    run.mkdir(parents=True, exist_ok=True)
    phases = JobPhases(run)
    phases.write(f"Loading model {config.model.name}")
    with (run / "train.log").open("a") as log:
        console = Console(file=log, width=120, force_terminal=False)
        summary = run_training(
            config, run_dir=run, resume=resume, callbacks=[phases], console=console
        )
    return {
        k: v
        for k, v in summary.items()
        if k in ("steps", "wall_s", "mean_step_s", "rollouts", "rollouts_trained")
    }


def run_sft_job(
    config_toml: str, run_dir: str, name: str | None, validation: tuple[str, str | None] | None
) -> dict[str, Any]:
    """Train the supervised job, or resume it (module docstring); returns its summary."""
    from rich.console import Console

    from rldojo.data.loading import DataError
    from rldojo.service.sft_data import renamed, validation_loss
    from rldojo.training.sft import run_sft

    run = Path(run_dir)
    config = config_of(config_toml)
    resume = (run / "config.toml").exists()
    run.mkdir(parents=True, exist_ok=True)
    stored = str(config.sft.data)
    phases = JobPhases(run, {stored: name or stored})
    phases.write(f"Loading model {config.model.name} and tokenizing the training file")
    with (run / "train.log").open("a") as log:
        console = Console(file=log, width=120, force_terminal=False)
        try:
            summary = run_sft(
                config, stored, run_dir=run, resume=resume, callbacks=[phases], console=console
            )
        except DataError as exc:  # name the uploaded file, not where it is stored
            raise renamed(exc, stored, name or stored) from None
    out = {
        k: summary[k]
        for k in ("steps", "wall_s", "demonstrations", "left_out", "loss_first", "loss_last")
    }
    if validation is not None:
        valid = validation_loss(
            summary["checkpoint"],
            validation[0],
            validation[1],
            max_seq_len=config.sft.max_seq_len,
            micro_batch_size=config.optim.micro_batch_size,
            device=config.run.device,
        )
        valid["step"] = summary["steps"]
        (run / VALIDATION).write_text(json.dumps(valid))
        out["full_valid_loss"] = valid["full_valid_loss"]
    return out
