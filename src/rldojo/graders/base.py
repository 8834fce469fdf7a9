"""The `Grader` protocol: a rollout and its task in, a `Score` out.

Graders are async and bounded in time. A grader that fails (raises, hangs, cannot parse)
returns `Score.failed("error" | "timeout" | "invalid", why)` — never a reward of 0 — and
the trainer keeps that sample out of the gradient. A grade that failed because code raised
(a reward function) keeps the exception's traceback as text in
`Score.provenance[TRACEBACK]`: the ledger stores it, and the failure budget makes it the
cause of the stop it raises (`rldojo.training.failure_budget`).
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Sequence
from typing import Protocol, TypeGuard, runtime_checkable

from rldojo.types import Rollout, Score, Task


@runtime_checkable
class Grader(Protocol):
    """Scores one finished rollout against its task.

    Optional members, each declared by a protocol of its own below (a grader without them
    is complete) and read by the function beside it: `pass_threshold`
    (`ThresholdGrader`, `pass_threshold_of`), `enforces_timeouts` (`SelfTimed`,
    `self_timed`), `close()` (`ClosableGrader`, `close_grader`), `grade_group()` and
    `supports_groups` (`GroupGrader`, `judges_groups`)."""

    name: str

    async def grade(self, rollout: Rollout, task: Task) -> Score: ...


@runtime_checkable
class ThresholdGrader(Protocol):
    """A grader that says at which value a grade passes (a grader spec's
    `pass_threshold`); None: it does not say."""

    @property
    def pass_threshold(self) -> float | None: ...


def pass_threshold_of(grader: Grader, default: float = 1.0) -> float:
    """The value at which `grader`'s grades pass: its `pass_threshold`, else `default`."""
    if isinstance(grader, ThresholdGrader) and grader.pass_threshold is not None:
        return float(grader.pass_threshold)
    return default


@runtime_checkable
class SelfTimed(Protocol):
    """A grader or environment whose calls bound their own time (one in a worker process,
    whose pool enforces a deadline per call): the episode engine adds no deadline of its
    own when `enforces_timeouts` is True."""

    @property
    def enforces_timeouts(self) -> bool: ...


def self_timed(obj: object) -> bool:
    """Whether `obj` (a grader or environment) bounds the time of its own calls."""
    return isinstance(obj, SelfTimed) and obj.enforces_timeouts


@runtime_checkable
class GroupGrader(Protocol):
    """A grader that can also score a group of one task's rollouts in one call (a group
    judge, batched reward functions, a spec grader around either): one score per rollout,
    in order."""

    @property
    def supports_groups(self) -> bool:
        """False where it cannot after all (a spec grader around a per-sample grader)."""
        ...

    async def grade_group(
        self, rollouts: Sequence[Rollout], task: Task, *, order: Sequence[int] | None = None
    ) -> list[Score]:
        """`order`: the order a judge sees the rollouts in (indices into `rollouts`; the
        position-bias probe sets it); None: the grader's own."""
        ...


def judges_groups(grader: Grader) -> TypeGuard[GroupGrader]:
    """Whether `grader` scores whole groups (`GroupGrader`, `supports_groups` True)."""
    return isinstance(grader, GroupGrader) and grader.supports_groups


@runtime_checkable
class ClosableGrader(Protocol):
    """A grader with something to release when its run ends (judge clients, worker pools);
    `close` may be a plain method or a coroutine function."""

    def close(self) -> Awaitable[None] | None: ...


async def close_grader(grader: Grader) -> None:
    """Release what `grader` holds: its `close()`, awaited when it returns an awaitable."""
    if isinstance(grader, ClosableGrader):
        result = grader.close()
        if result is not None:
            await result


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
