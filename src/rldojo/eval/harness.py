"""Held-out evaluation: greedy (or sampled) answers on a test split, graded, summarised.

The trainer calls `evaluate` before and after training; `rldojo eval` calls it for any
model. Accuracy is the share of tasks whose score passes (`components["correct"] == 1`
when the grader reports correctness, else `value >= pass_threshold`); grader failures are
counted separately and are not counted as wrong.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rldojo.envs.base import Env
from rldojo.graders.base import Grader
from rldojo.policy.base import Policy
from rldojo.rollout.engine import collect_rollouts, grade_rollouts
from rldojo.types import Rollout, SamplingParams, Score, Task


@dataclass
class EvalResult:
    n: int
    accuracy: float
    mean_reward: float
    statuses: dict[str, int]
    ci95: tuple[float, float]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        return {
            f"{prefix}/accuracy": self.accuracy,
            f"{prefix}/mean_reward": self.mean_reward,
            f"{prefix}/n": float(self.n),
            f"{prefix}/failed": float(sum(v for k, v in self.statuses.items() if k != "ok")),
        }


def passed(score: Score, pass_threshold: float = 1.0) -> bool:
    if not score.ok:
        return False
    if "correct" in score.components:
        return score.components["correct"] >= 1.0
    return (score.value or 0.0) >= pass_threshold


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default)."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


async def evaluate(
    make_env: Callable[[], Env],
    grader: Grader,
    policy: Policy,
    tasks: Sequence[Task],
    sampling: SamplingParams,
    *,
    seed: int = 0,
    grade_timeout_s: float = 30.0,
) -> EvalResult:
    """Run each task once with `sampling` and summarise the graded results."""
    requests = [(task, 0, seed + i) for i, task in enumerate(tasks)]
    rollouts: list[Rollout] = await collect_rollouts(make_env, policy, requests, sampling)
    scores = await grade_rollouts(grader, rollouts, list(tasks), timeout_s=grade_timeout_s)
    ok = [s for s in scores if s.ok]
    k = sum(passed(s) for s in scores)
    rows = [
        {
            "task_id": t.id,
            "answer": t.answer,
            "completion": r.completion,
            "value": s.value,
            "status": s.status,
            "passed": passed(s),
        }
        for t, r, s in zip(tasks, rollouts, scores, strict=True)
    ]
    return EvalResult(
        n=len(tasks),
        accuracy=k / max(len(tasks), 1),
        mean_reward=sum(s.value or 0.0 for s in ok) / max(len(ok), 1),
        statuses=dict(Counter(s.status for s in scores)),
        ci95=wilson_interval(k, len(tasks)),
        rows=rows,
    )
