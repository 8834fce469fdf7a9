"""Held-out evaluation: answers on a test split, graded, summarised with intervals.

`evaluate` (one sample per task, accuracy + Wilson interval) is what the trainer calls
before and after training. `evaluate_samples` draws K samples per task and keeps every
grade, so `SampledEval.summary` can report pass@k (unbiased), avg@k and maj@k with
task-level bootstrap intervals, and `compare_evals` can pair two models on the same
tasks (paired bootstrap and exact McNemar; see `rldojo.eval.stats`).

A task *passes* when its score passes (`components["correct"] == 1` when the grader
reports correctness, else `value >= pass_threshold`). Grader and rollout failures are
not wrong answers: they are counted by status and left out of every denominator.

Both take `progress` (`rldojo.rollout.episodes.TurnProgress`): how many of each turn's
episodes have their answer, as they come (`evaluating before: 64/128` on the console).

Policies: any `rldojo.policy.base.Policy`: the local transformers model, or a text-level
adapter from `rldojo.policy.adapters` (`OpenAIPolicy` for an OpenAI-compatible endpoint,
`callable_policy(fn)` for baselines, oracles and tests).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rldojo.envs.base import Env, EnvFactory
from rldojo.eval.stats import (
    bootstrap_ci,
    majority_correct,
    mcnemar,
    paired_bootstrap,
    pass_at_k,
)
from rldojo.graders.base import Grader, passed
from rldojo.graders.rules import extract_answer, normalize_answer
from rldojo.policy.base import Policy
from rldojo.rollout.episodes import TurnProgress, collect_rollouts, grade_rollouts
from rldojo.types import Rollout, SamplingParams, Score, Task, first_policy_turn


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
            f"{prefix}/ci_low": float(self.ci95[0]),
            f"{prefix}/ci_high": float(self.ci95[1]),
        }


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
    make_env: EnvFactory,
    grader: Grader,
    policy: Policy,
    tasks: Sequence[Task],
    sampling: SamplingParams,
    *,
    seed: int = 0,
    grade_timeout_s: float = 30.0,
    pass_threshold: float = 1.0,
    episode: Mapping[str, Any] | None = None,
    progress: TurnProgress | None = None,
) -> EvalResult:
    """Run each task once with `sampling` and summarise the graded results (a task is
    correct when `passed(score, pass_threshold)`). `episode` holds the engine's episode
    limits (`collect_rollouts`' `max_turns`, `max_episode_tokens`, `env_timeout_s`), so
    an evaluation plays episodes under the same limits as training; `progress` hears
    how far each turn got."""
    requests = [(task, 0, seed + i) for i, task in enumerate(tasks)]
    rollouts: list[Rollout] = await collect_rollouts(
        make_env, policy, requests, sampling, progress=progress, **dict(episode or {})
    )
    scores = await grade_rollouts(grader, rollouts, list(tasks), timeout_s=grade_timeout_s)
    ok = [s for s in scores if s.ok]
    k = sum(passed(s, pass_threshold) for s in scores)
    rows = [
        {
            "task_id": t.id,
            "answer": t.answer,
            "completion": r.completion,
            "value": s.value,
            "status": s.status,
            "passed": passed(s, pass_threshold),
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


# ------------------------------------------------------------------ K samples per task


@dataclass
class TaskResult:
    """All K graded samples of one task. Failed samples (status not ok) are kept but are
    left out of `n`, `c` and every metric."""

    task_id: str
    reference: str | None
    passes: list[bool]
    statuses: list[str]
    values: list[float | None]
    answers: list[str | None]
    completions: list[str]

    @property
    def n(self) -> int:
        return sum(s == "ok" for s in self.statuses)

    @property
    def c(self) -> int:
        return sum(p for p, s in zip(self.passes, self.statuses, strict=True) if s == "ok")

    def pass_at(self, k: int) -> float | None:
        """Unbiased pass@k of this task; None with fewer than k graded samples."""
        return pass_at_k(self.n, self.c, k) if self.n >= k else None

    def majority(self) -> bool | None:
        """Whether the majority (normalised) answer of the graded samples is correct."""
        ok = [i for i, s in enumerate(self.statuses) if s == "ok"]
        if not ok:
            return None
        return majority_correct([self.answers[i] for i in ok], [self.passes[i] for i in ok])

    def mean_reward(self) -> float | None:
        vals = [v for v, s in zip(self.values, self.statuses, strict=True) if s == "ok"]
        return sum(v or 0.0 for v in vals) / len(vals) if vals else None


@dataclass(frozen=True)
class MetricCI:
    """A metric's value over `n` tasks with its bootstrap interval, and the Wilson interval
    when every per-task value is 0 or 1 (the percentile bootstrap collapses to a point
    when all tasks pass or all fail; Wilson does not)."""

    value: float
    lo: float
    hi: float
    n: int
    wilson: tuple[float, float] | None = None


@dataclass
class SampledEval:
    """The result of `evaluate_samples`: per-task results and per-sample records."""

    samples: int
    tasks: list[TaskResult]
    records: list[dict[str, Any]] = field(default_factory=list)

    def statuses(self) -> dict[str, int]:
        return dict(Counter(s for t in self.tasks for s in t.statuses))

    def per_task(self, metric: str) -> dict[str, float]:
        """Per-task scores of `metric` (`pass@K`, `avg`, `maj`, `reward`), tasks with data."""
        scores: dict[str, Callable[[TaskResult], float | bool | None]] = {
            "avg": lambda t: t.c / t.n if t.n else None,
            "maj": TaskResult.majority,
            "reward": TaskResult.mean_reward,
        }
        if metric.startswith("pass@"):
            k = int(metric[5:])
            scores[metric] = lambda t: t.pass_at(k)
        if metric not in scores:
            raise ValueError(f"unknown metric {metric!r}")
        values = {t.task_id: scores[metric](t) for t in self.tasks}
        return {tid: float(v) for tid, v in values.items() if v is not None}

    def summary(
        self, ks: Sequence[int] = (1,), *, n_resamples: int = 2000, seed: int = 0
    ) -> dict[str, MetricCI]:
        """pass@k for each k, avg@K, maj@K and mean reward, with 95% bootstrap intervals."""
        names = [f"pass@{k}" for k in ks if k <= self.samples]
        names += [f"avg@{self.samples}", f"maj@{self.samples}", "reward"]
        out = {}
        for name in names:
            key = name.split("@")[0] if name[:3] in ("avg", "maj") else name
            values = list(self.per_task(key).values())
            mean = sum(values) / len(values) if values else math.nan
            lo, hi = bootstrap_ci(values, n_resamples=n_resamples, seed=seed)
            binary = all(v in (0.0, 1.0) for v in values)
            wilson = wilson_interval(int(sum(values)), len(values)) if binary else None
            out[name] = MetricCI(mean, lo, hi, len(values), wilson)
        return out


def _record(task: Task, r: Rollout, s: Score, ok: bool) -> dict[str, Any]:
    """One sample's grade and episode. `turns` is the conversation after the prompt (from
    the first policy turn on: tool results and environment turns included), so a
    multi-turn failure can be read whole, not only its final `completion`."""
    return {
        "task_id": task.id,
        "env": r.env or task.env,
        "sample": r.sample_index,
        "status": r.status,
        "error": r.error,
        "score_status": s.status,
        "value": s.value,
        "components": dict(s.components),
        "flags": list(s.flags),
        "explanation": s.explanation,
        "completion": r.completion,
        "turns": [dict(m) for m in r.messages[first_policy_turn(r.messages) :]],
        "passed": ok,
        "info": {k: v for k, v in r.info.items() if isinstance(v, str | int | float | bool)},
    }


def _normalised_answer(text: str) -> str | None:
    answer = extract_answer(text)
    return None if answer is None else normalize_answer(answer)


async def evaluate_samples(
    make_env: Callable[[], Env],
    grader: Grader,
    policy: Policy,
    tasks: Sequence[Task],
    sampling: SamplingParams,
    *,
    samples: int = 1,
    seed: int = 0,
    grade_timeout_s: float = 30.0,
    episode: Mapping[str, Any] | None = None,
    progress: TurnProgress | None = None,
    pass_threshold: float = 1.0,
) -> SampledEval:
    """Run every task `samples` times with `sampling` and keep every grade. `episode`
    holds the engine's episode limits and `progress` hears each turn's, as in `evaluate`
    (counting samples); a sample passes when `passed(score, pass_threshold)`."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    requests = [(t, j, seed + i * samples + j) for i, t in enumerate(tasks) for j in range(samples)]
    params = sampling if sampling.seed is not None else replace(sampling, seed=seed)
    rollouts = await collect_rollouts(
        make_env, policy, requests, params, progress=progress, **dict(episode or {})
    )
    scores = await grade_rollouts(
        grader, rollouts, [t for t, _, _ in requests], timeout_s=grade_timeout_s
    )
    results, records = [], []
    for i, task in enumerate(tasks):
        rs, ss = rollouts[i * samples : (i + 1) * samples], scores[i * samples : (i + 1) * samples]
        oks = [passed(s, pass_threshold) for s in ss]
        records += [_record(task, r, s, ok) for r, s, ok in zip(rs, ss, oks, strict=True)]
        results.append(
            TaskResult(
                task_id=task.id,
                reference=task.answer,
                passes=oks,
                statuses=[s.status for s in ss],
                values=[s.value for s in ss],
                answers=[_normalised_answer(r.completion) for r in rs],
                completions=[r.completion for r in rs],
            )
        )
    return SampledEval(samples, results, records)


def compare_evals(
    a: SampledEval, b: SampledEval, *, n_resamples: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """Pair two evaluations on their common tasks: B minus A.

    Paired bootstrap of the per-task avg@K (pass rate) difference, and the exact McNemar
    test on the per-task majority-vote outcome (the single sample when K = 1).
    """
    avg_a, avg_b = a.per_task("avg"), b.per_task("avg")
    common = [t for t in avg_a if t in avg_b]
    paired = paired_bootstrap(
        [avg_a[t] for t in common], [avg_b[t] for t in common], n_resamples=n_resamples, seed=seed
    )
    maj_a, maj_b = a.per_task("maj"), b.per_task("maj")
    both = [t for t in maj_a if t in maj_b]
    test = mcnemar([maj_a[t] > 0 for t in both], [maj_b[t] > 0 for t in both])
    flips = {
        "a_only": [t for t in both if maj_a[t] > 0 and not maj_b[t] > 0],
        "b_only": [t for t in both if maj_b[t] > 0 and not maj_a[t] > 0],
    }
    return {
        "tasks": len(common),
        "mean_a": paired.mean_a,
        "mean_b": paired.mean_b,
        "diff": paired.diff,
        "diff_ci95": list(paired.ci),
        "bootstrap_p": paired.p_value,
        "mcnemar": {"a_only": test.a_only, "b_only": test.b_only, "p_value": test.p_value},
        "flipped_tasks": flips,
    }
