"""The `Grader` protocol: a rollout and its task in, a `Score` out.

Graders are async and bounded in time. A grader that fails (raises, hangs, cannot parse)
returns `Score.failed("error" | "timeout" | "invalid", why)` — never a reward of 0 — and
the trainer keeps that sample out of the gradient. A grade that failed because code raised
(a reward function) keeps the exception's traceback as text in
`Score.provenance[TRACEBACK]`: the ledger stores it, and the failure budget makes it the
cause of the stop it raises (`rldojo.training.failures`).
"""

from __future__ import annotations

import traceback
from typing import Protocol, runtime_checkable

from rldojo.types import Rollout, Score, Task


@runtime_checkable
class Grader(Protocol):
    """Scores one finished rollout against its task."""

    name: str

    async def grade(self, rollout: Rollout, task: Task) -> Score: ...


def passed(score: Score, pass_threshold: float = 1.0) -> bool:
    """The pass rule of evaluations, pass rates and demonstrations: a failed grade never
    passes; a grader that reports correctness (`components["correct"]`) passes at 1;
    otherwise the value must reach `pass_threshold`."""
    if not score.ok:
        return False
    if "correct" in score.components:
        return score.components["correct"] >= 1.0
    return (score.value or 0.0) >= pass_threshold


TRACEBACK = "traceback"
"""The `Score.provenance` key of a failed grade's traceback (text; see the module docstring)."""
TRACEBACK_CHARS = 8000
"""A longer traceback (deep recursion) keeps its last characters: the frames that raised."""


def traceback_text(exc: BaseException) -> str:
    """`exc`'s traceback as Python prints it, from the frame below the one that caught it
    (the grader's own call of the user's code) on, at most `TRACEBACK_CHARS` long."""
    tb = exc.__traceback__
    text = "".join(traceback.format_exception(type(exc), exc, tb.tb_next if tb else None))
    return text if len(text) <= TRACEBACK_CHARS else "..." + text[-TRACEBACK_CHARS:]
