"""The run's metric log: JSON lines (always) and the sinks of `run.report_to`.

Metric names are namespaced (`reward/`, `loss/`, `entropy/`, `time/`, `rollout/`, `eval/`).
Every record goes to `metrics.jsonl` as logged; the sinks (`rldojo.report.trackers`:
TensorBoard, W&B, Trackio, MLflow) get its finite scalars and its texts (e.g. the
forking-token list) at the record's step, evaluation records under `eval/` names.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rldojo.report.trackers import Sink, check_report_to, make_sinks


class MetricsLogger:
    """Writes one JSON object per record to `metrics.jsonl` and hands it to the sinks.

    Each record has `step` and `kind`: `train` for a step's metrics, `eval` for an
    evaluation logged at that step (they share step numbers). `report_to` names the sinks
    (`run.report_to`); a tracker whose package is missing is a one-line `ConfigError`
    here, before anything is written. Sinks open on the first record, so an invocation
    that logs nothing (a resume of a finished run) adds no event file or tracker run;
    `resume_step` makes TensorBoard drop the events after that step that an earlier,
    killed invocation wrote (they are redone), and the trackers continue the run recorded
    in RUN/trackers.json. `config` (the run's config as plain data) becomes the trackers'
    hyperparameters.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        report_to: Sequence[str] = ("tensorboard",),
        resume_step: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        check_report_to(report_to)
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self.sinks: list[Sink] = make_sinks(
            report_to, run_dir, resume_step=resume_step, config=config
        )

    def log(self, step: int, metrics: dict[str, Any], *, kind: str = "train") -> None:
        record = {"step": step, "kind": kind, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        scalars, texts = split_values(metrics, kind=kind)
        for sink in self.sinks:
            sink.log(step, scalars, texts, kind=kind)

    def close(self) -> None:
        """Close the file and every sink; called from a `finally` while an error
        propagates, it marks the tracker runs failed."""
        failed = sys.exc_info()[0] is not None
        self._file.close()
        errors = []
        for sink in self.sinks:
            try:
                sink.close(failed=failed)
            except Exception as exc:  # close the others, then raise the first
                errors.append(exc)
        if errors:
            raise errors[0]


def split_values(
    metrics: Mapping[str, Any], *, kind: str = "train"
) -> tuple[dict[str, float], dict[str, str]]:
    """`(scalars, texts)` the sinks get: finite numbers (bools as 0/1) and strings or
    lists (as their `str`); an `eval` record's names get the `eval/` prefix if they lack
    it. Anything else (None, NaN, inf) is for the JSONL file only."""
    scalars: dict[str, float] = {}
    texts: dict[str, str] = {}
    for key, value in metrics.items():
        name = key if kind != "eval" or key.startswith("eval/") else f"eval/{key}"
        if hasattr(value, "item") and not isinstance(value, str | list):
            value = value.item()
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float) and math.isfinite(value):
            scalars[name] = value
        elif isinstance(value, str | list):
            texts[name] = str(value)
    return scalars, texts


def _jsonable(value: object) -> object:
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
