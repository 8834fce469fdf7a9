"""The `Grader` protocol: a rollout and its task in, a `Score` out.

Graders are async and bounded in time. A grader that fails (raises, hangs, cannot parse)
returns `Score.failed("error" | "timeout" | "invalid", why)` — never a reward of 0 — and
the trainer keeps that sample out of the gradient.
"""

from __future__ import annotations

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
