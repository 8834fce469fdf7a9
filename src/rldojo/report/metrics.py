"""Metric sinks for a run: JSON lines (always) and TensorBoard event files.

Metric names are namespaced (`reward/`, `loss/`, `entropy/`, `time/`, `rollout/`, `eval/`).
Scalars go to both sinks; text values (e.g. the forking-token list) go to the JSONL file
and to TensorBoard's text plugin.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Writes one JSON object per step to `metrics.jsonl` and scalars to TensorBoard."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:  # tensorboard is a dependency, but keep the run alive without it
                self._tb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is None:
            return
        for key, value in metrics.items():
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int | float) and math.isfinite(value):
                self._tb.add_scalar(key, value, step)
            elif isinstance(value, str | list):
                self._tb.add_text(key, str(value), step)
        self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All step records of a run, in order."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
