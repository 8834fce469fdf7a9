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
