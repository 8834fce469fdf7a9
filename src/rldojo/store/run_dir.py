"""One run, one directory: `rldojo train`, `sft` and `distill` never write into a
directory that already holds a run unless told what to do with it.

- `claim_run_dir(path, command=..., resume=..., overwrite=...)` is called before any
  work starts. A directory holding a run (a `config.toml`, `metrics.jsonl`,
  `ledger.sqlite`, `summary.json` or `checkpoints/`) is refused with one line naming it,
  how far the old run got, and the ways on: `--resume`, another `run.name`, or
  `--overwrite`, which moves the old directory aside (`NAME.old-YYYYmmdd-HHMMSS`, never
  deleted).
- `resume_changes(stored, new)` lists the config keys a resume would change, split into
  those that change what the ledger's rollouts mean (refused unless `--force`) and the
  harmless ones (`run.steps`, the evaluation cadence, trackers, ...).
- `record_config_change(path, ...)` appends each start and resume, with the keys it
  changed, to `RUN/config_history.jsonl`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["MEANING_KEYS", "RunDirError", "claim_run_dir", "describe_run", "holds_run",
           "record_config_change", "resume_changes"]  # fmt: skip

_MARKERS = ("config.toml", "metrics.jsonl", "ledger.sqlite", "summary.json", "checkpoints")

MEANING_KEYS = (
    "model.",
    "env.",
    "grader.",
    "sampling.",
    "curriculum.",
    "rollout.group_size",
    "rollout.prompts_per_step",
    "rollout.max_turns",
    "rollout.max_episode_tokens",
    "run.seed",
)
"""Config keys (prefixes) that change what the ledger's rollouts mean: which model drew
them, from which tasks and draw order, how they were sampled, graded and grouped. A
resume that changes one is refused unless forced; every other key may change."""

_RESOLVED = {"model.generation_dtype": "auto", "model.autocast_bf16": "auto",
             "rollout.worker_threads": None}  # fmt: skip
"""Keys a run writes resolved for its machine (`config.toml` records `bf16`, not `auto`):
a resume that leaves them at their automatic value changes nothing."""


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (exit code 2, nothing started)."""


def holds_run(path: Path) -> bool:
    """True when `path` holds anything a run writes."""
    return path.is_dir() and any((path / name).exists() for name in _MARKERS)


def describe_run(path: Path) -> str:
    """How far the run in `path` got, e.g. "finished at step 12 (summary.json)",
    "step 3 logged, newest checkpoint step_000002", "started, no step logged"."""
    summary = path / "summary.json"
    if summary.exists():
        try:
            data = json.loads(summary.read_text())
        except (OSError, json.JSONDecodeError):
            data = {}
        how = data.get("stopped", "finished")
        return f"{'finished' if how == 'steps' else how} at step {data.get('steps', '?')}"
    steps = _logged_steps(path / "metrics.jsonl")
    ckpts = sorted((path / "checkpoints").glob("step_*")) if (path / "checkpoints").exists() else []
    logged = f"step {max(steps)} logged" if steps else "no step logged"
    newest = f", newest checkpoint {ckpts[-1].name}" if ckpts else ", no checkpoint"
    return f"stopped early: {logged}{newest}"


def _logged_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            steps.append(record["step"])
    return steps


def claim_run_dir(
    path: Path, *, command: str, resume: bool = False, overwrite: bool = False
) -> Path | None:
    """Make `path` usable for a new run (or check it for a resume); returns where an
    overwritten run was moved, else None. Raises `RunDirError` with the one line to show."""
    if resume:
        if not (path / "config.toml").exists():
            raise RunDirError(f"{path}: not a run directory (no config.toml) to resume")
        return None
    if not holds_run(path):
        return None
    if overwrite:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.name}.old-{stamp}")
        n = 1
        while aside.exists():
            aside, n = path.with_name(f"{path.name}.old-{stamp}-{n}"), n + 1
        path.rename(aside)
        return aside
    ways = f"--resume {path}, " if command == "train" else ""
    raise RunDirError(
        f"{path} already holds a run ({describe_run(path)}): {ways}another run.name, or "
        f"--overwrite to move it aside"
    )


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def resume_changes(
    stored: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
    """The keys whose value differs between the run's config and the resume's, as
    `(meaning, harmless)`: each `{key: (old, new)}`. Both configs are plain dicts
    (`TrainConfig.model_dump(mode="json")`)."""
    old, now = _flatten(stored), _flatten(new)
    meaning: dict[str, tuple[Any, Any]] = {}
    harmless: dict[str, tuple[Any, Any]] = {}
    for key in sorted(old.keys() | now.keys()):
        before, after = old.get(key), now.get(key)
        if before == after or (key in _RESOLVED and after == _RESOLVED[key]):
            continue
        kind = meaning if key.startswith(MEANING_KEYS) else harmless
        kind[key] = (before, after)
    return meaning, harmless


def record_config_change(path: Path, event: str, changed: Mapping[str, tuple[Any, Any]]) -> None:
    """Append `{"time", "event", "changed": {key: [old, new]}}` to RUN/config_history.jsonl."""
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "event": event,
        "changed": {k: list(v) for k, v in changed.items()},
    }
    with (path / "config_history.jsonl").open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")
