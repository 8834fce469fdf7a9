"""The failure budget: a run where too little can be scored stops and says why.

A failed episode or grade is a status, kept out of the gradient (`rldojo.types.Score`);
that is right for the odd crash, but a run where most samples fail is not learning.
`FailureBudget.observe` is given each step's rollouts and scores; it returns a
`FailureBudgetExceeded` (the loop raises it after the step is logged) when

- more than `run.max_failure_rate` of the rollouts of the last `run.failure_window`
  steps failed, or
- every rollout of the run's first observed step failed (the preflight: a grader that
  errors on everything stops the run after one step, not after a window).

Before step 1, `reference_preflight` grades up to 8 reference answers of single-turn
tasks that have one (`Task.answer`, as the assistant's reply to the task's prompt) and
returns the stop when every one of them fails to grade: a broken grader or an
unreachable judge stops the run before any generation. A reference answer the grader
scores low is not a failure; only a grade that could not be made is.

A failure is an episode whose status is not `ok`/`truncated` (`env_error`,
`policy_error`, `timeout`), or a grade whose status is not `ok` (`error`, `timeout`,
`invalid`). A truncated episode that was graded is not a failure. `run.max_failure_rate
= 1` turns the budget off.

A stop names the first error message of the most common kind; when those grades kept a
traceback (a reward function that raised: `rldojo.graders.base.TRACEBACK`), the first is
the stop's `__cause__`, so `rldojo --debug` shows the frame that raised.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from rldojo.envs.base import SingleTurnEnv
from rldojo.graders.base import TRACEBACK, Grader
from rldojo.rollout.episodes import grade_rollouts
from rldojo.rollout.mixture import EnvMixture
from rldojo.training.stops import FailureBudgetExceeded
from rldojo.types import Rollout, Score, Task

__all__ = ["FailureBudget", "failure_kind", "reference_preflight"]


def failure_kind(rollout: Rollout, score: Score) -> str | None:
    """`"episode <status>"`, `"grader <status>"`, or None when the sample was scored."""
    if rollout.status not in ("ok", "truncated"):
        return f"episode {rollout.status}"
    if not score.ok:
        return f"grader {score.status}"
    return None


@dataclass
class _Step:
    step: int
    total: int
    kinds: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)  # kind -> its first error message
    traces: dict[str, str] = field(default_factory=dict)  # kind -> its first traceback


class FailureBudget:
    """Failure counts of the last `window` steps, against `max_rate`."""

    def __init__(self, max_rate: float, window: int) -> None:
        self.max_rate = max_rate
        self._steps: deque[_Step] = deque(maxlen=window)
        self._observed = 0

    def observe(
        self, step: int, rollouts: Sequence[Rollout], scores: Sequence[Score]
    ) -> FailureBudgetExceeded | None:
        """Count step `step`'s failures; the stop to raise, or None."""
        record = _Step(step, len(rollouts))
        for rollout, score in zip(rollouts, scores, strict=True):
            kind = failure_kind(rollout, score)
            if kind is not None:
                record.kinds[kind] += 1
                record.first.setdefault(kind, _one_line(score.explanation or rollout.error))
                if score.provenance.get(TRACEBACK):
                    record.traces.setdefault(kind, str(score.provenance[TRACEBACK]))
        self._steps.append(record)
        self._observed += 1
        if self.max_rate >= 1.0:
            return None
        failed = sum(record.kinds.values())
        if self._observed == 1 and record.total and failed == record.total:
            return self._stop([record], preflight=True)
        window = list(self._steps)
        total = sum(s.total for s in window)
        failed = sum(sum(s.kinds.values()) for s in window)
        if len(window) == self._steps.maxlen and total and failed > self.max_rate * total:
            return self._stop(window, preflight=False)
        return None

    def _stop(self, window: list[_Step], *, preflight: bool) -> FailureBudgetExceeded:
        kinds: Counter[str] = Counter()
        first: dict[str, str] = {}
        traces: dict[str, str] = {}
        for s in window:
            kinds.update(s.kinds)
            for kind, message in s.first.items():
                first.setdefault(kind, message)
            for kind, trace in s.traces.items():
                traces.setdefault(kind, trace)
        total = sum(s.total for s in window)
        worst, _ = kinds.most_common(1)[0]
        a, b = window[0].step, window[-1].step
        steps = f"step {a}" if a == b else f"steps {a}-{b}"
        if len(kinds) == 1:
            counted = f"{worst} in {kinds[worst]}/{total} samples of {steps}"
        else:
            parts = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
            counted = f"{sum(kinds.values())}/{total} samples of {steps} failed ({parts})"
        why = (
            "every sample of the first step failed"
            if preflight
            else f"over run.max_failure_rate = {self.max_rate:g}"
        )
        message = f"{counted}: {first[worst]} ({why})"
        return FailureBudgetExceeded(
            message,
            counts=dict(kinds),
            total=total,
            steps=(a, b),
            first_error=first[worst],
            traceback=traces.get(worst, ""),
        )


def reference_preflight(
    envs: EnvMixture,
    grader: Grader,
    loop: asyncio.AbstractEventLoop,
    *,
    timeout_s: float,
    n: int = 8,
) -> FailureBudgetExceeded | None:
    """Grade up to `n` reference answers (module docstring); the stop when every grade
    failed, else None (also when no environment has single-turn tasks with answers)."""
    samples: list[tuple[Rollout, Task]] = []
    for slot in envs.slots.values():
        env = slot.make()
        if not isinstance(env, SingleTurnEnv):  # an agentic episode cannot be faked
            continue
        for task in slot.train_tasks:
            if task.answer is not None and len(samples) < n:
                reply = {"role": "assistant", "content": str(task.answer)}
                rollout = Rollout(
                    task_id=task.id,
                    env=task.env,
                    completion=str(task.answer),
                    messages=[*env.prompt_messages(task), reply],
                )
                samples.append((rollout, task))
    if not samples:
        return None
    rollouts, tasks = [r for r, _ in samples], [t for _, t in samples]
    scores = loop.run_until_complete(grade_rollouts(grader, rollouts, tasks, timeout_s=timeout_s))
    if any(score.ok for score in scores):
        return None
    kinds = Counter(f"grader {score.status}" for score in scores)
    worst, count = kinds.most_common(1)[0]
    first = next(_one_line(s.explanation) for s in scores if f"grader {s.status}" == worst)
    trace = next((str(s.provenance[TRACEBACK]) for s in scores if s.provenance.get(TRACEBACK)), "")
    return FailureBudgetExceeded(
        f"grader preflight: {worst} in {count}/{len(scores)} reference answers: {first} "
        "(nothing generated yet)",
        counts=dict(kinds),
        total=len(scores),
        first_error=first,
        traceback=trace,
    )


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit] or "(no message)"
