"""A finished job's results file: OpenAI's `step_metrics.csv`, one row per step.

`results_csv(run_dir, kind)` reads `RUN/metrics.jsonl` (the last record of each step and
kind wins: a resumed run may log a step again) and, for a supervised job,
`RUN/validation.json`:

    reinforcement  step,train_reward,train_reward_std,train_pass_rate,valid_reward,
                   valid_accuracy,train_groups_informative (valid_*: the evaluation on the
                   validation file at that step, step 0 the one before training;
                   train_groups_informative: the step's groups whose rewards differed,
                   the ones GRPO learns from; a step with none carried no signal)
    supervised     step,train_loss,train_tokens,learning_rate,full_valid_loss,
                   full_valid_mean_token_accuracy (full_valid_*: the last step, with a
                   validation file)

An empty cell is a value that step does not have. `write_results_file` stores it as a
service file (`purpose = "fine-tune-results"`, owned by the job's key) whose id the job
lists in `result_files`; `signal_steps` counts a reinforcement job's steps that carried
learning signal; `sft_trained_tokens` sums the assistant tokens a supervised job
trained on.
"""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

from rldojo.service.state import ServiceState, new_id

__all__ = ["results_csv", "sft_trained_tokens", "signal_steps", "write_results_file"]

RESULTS_PURPOSE = "fine-tune-results"

_COLUMNS = {
    "reinforcement": {
        "train_reward": ("train", "reward/mean"),
        "train_reward_std": ("train", "reward/std"),
        "train_pass_rate": ("train", "reward/pass_rate"),
        "valid_reward": ("eval", "eval/mean_reward"),
        "valid_accuracy": ("eval", "eval/accuracy"),
        "train_groups_informative": ("train", "rollout/groups_informative"),
    },
    "supervised": {
        "train_loss": ("sft", "sft/loss"),
        "train_tokens": ("sft", "sft/tokens"),
        "learning_rate": ("sft", "sft/lr"),
        "full_valid_loss": ("valid", "full_valid_loss"),
        "full_valid_mean_token_accuracy": ("valid", "full_valid_mean_token_accuracy"),
    },
}


def _records(run_dir: Path) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line cut off by a kill
                continue
            out[(str(record.get("kind", "train")), int(record.get("step", 0)))] = record
    valid = run_dir / "validation.json"
    if valid.exists():
        record = json.loads(valid.read_text())
        out[("valid", int(record["step"]))] = record
    return out


def results_csv(run_dir: Path, kind: str) -> str:
    """The CSV text (module docstring); `kind` is the job's method type."""
    columns = _COLUMNS[kind]
    kinds = {k for k, _ in columns.values()}
    records = _records(run_dir)
    steps = sorted({step for k, step in records if k in kinds})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", *columns])
    for step in steps:
        row: list[Any] = [step]
        for source, key in columns.values():
            value = records.get((source, step), {}).get(key)
            row.append("" if value is None else value)
        writer.writerow(row)
    return buffer.getvalue()


def sft_trained_tokens(run_dir: Path) -> int:
    """Assistant tokens of every SFT step (each epoch counts its tokens again)."""
    return sum(
        int(r.get("sft/tokens") or 0) for (k, _), r in _records(run_dir).items() if k == "sft"
    )


def signal_steps(run_dir: Path) -> tuple[int, int]:
    """(steps with `rollout/groups_informative` > 0, steps) of a reinforcement run."""
    train = [r for (k, _), r in _records(run_dir).items() if k == "train"]
    return sum(1 for r in train if (r.get("rollout/groups_informative") or 0) > 0), len(train)


def write_results_file(state: ServiceState, files_dir: Path, job: dict[str, Any]) -> str:
    """Store the job's results CSV as the owner's file; returns its id."""
    text = results_csv(Path(job["run_dir"]), job["method"]["type"]).encode()
    file_id = new_id("file")
    files_dir.mkdir(parents=True, exist_ok=True)
    path = files_dir / f"{file_id}.csv"
    path.write_bytes(text)
    state.add_file(
        {
            "id": file_id,
            "owner": job["owner"],
            "filename": "step_metrics.csv",
            "bytes": len(text),
            "purpose": RESULTS_PURPOSE,
            "created_at": int(time.time()),
            "path": str(path),
        }
    )
    return file_id
