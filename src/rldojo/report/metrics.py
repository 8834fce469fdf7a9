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
    """Writes one JSON object per record to `metrics.jsonl` and scalars to TensorBoard.

    Each record has `step` and `kind`: `train` for a step's metrics, `eval` for an
    evaluation logged at that step (they share step numbers). The TensorBoard writer is
    opened on the first record, so an invocation that logs nothing (a resume of a
    finished run) adds no event file; `resume_step` makes TensorBoard drop the events
    after that step that an earlier, killed invocation wrote (they are redone).
    """

    def __init__(
        self, run_dir: Path, *, tensorboard: bool = True, resume_step: int | None = None
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._run_dir = run_dir
        self._file = self.path.open("a", encoding="utf-8")
        self._want_tb = tensorboard
        self._resume_step = resume_step
        self._tb: Any = None

    def _writer(self) -> Any:
        if self._tb is None and self._want_tb:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is a dependency, but keep the run alive
                self._want_tb = False
                return None
            purge = None if self._resume_step is None else self._resume_step + 1
            self._tb = SummaryWriter(log_dir=str(self._run_dir / "tensorboard"), purge_step=purge)
        return self._tb

    def log(self, step: int, metrics: dict[str, Any], *, kind: str = "train") -> None:
        record = {"step": step, "kind": kind, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        tb = self._writer()
        if tb is None:
            return
        for key, value in metrics.items():
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int | float) and math.isfinite(value):
                tb.add_scalar(key, value, step)
            elif isinstance(value, str | list):
                tb.add_text(key, str(value), step)
        tb.flush()

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
