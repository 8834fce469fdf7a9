"""Statistics for evaluations: pass@k, majority vote, bootstrap intervals, paired tests.

Pure functions of numbers (no models, no I/O), so each is tested against enumeration or
simulation (`tests/eval/test_stats.py`). The resampling unit is always the *task*: the K
samples of one task are correlated, so resampling samples would understate the spread.

- `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. 2021 ("Evaluating Large
  Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), computed as a
  product so it never overflows.
- `majority_answer` / `majority_correct`: maj@k (self-consistency, Wang et al. 2022).
- `bootstrap_ci`: percentile bootstrap of a per-task statistic's mean (Efron 1979).
- `paired_bootstrap`: the difference of two systems on the *same* tasks, resampling
  task indices jointly (Koehn 2004); far tighter than comparing two separate intervals.
- `mcnemar`: exact McNemar test on paired binary outcomes (binomial on the discordant
  pairs), valid at any sample size.
- `wilson_interval` lives in `rldojo.eval.harness` (kept there for the trainer).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "McNemarResult",
    "PairedResult",
    "bootstrap_ci",
    "majority_answer",
    "majority_correct",
    "mcnemar",
    "paired_bootstrap",
    "pass_at_k",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n passes.

    `n` samples of which `c` passed. Unbiased for the model's pass@k when the n samples
    are i.i.d. Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)   (numerically stable form)
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-None answer; ties go to the one seen first. None if none."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def majority_correct(answers: Sequence[str | None], passed: Sequence[bool]) -> bool:
    """Whether the majority answer is a correct one (maj@k for one task).

    `answers[i]` is sample i's normalised answer (None: no answer), `passed[i]` its grade.
    The majority answer is correct when any sample that gave it passed (samples with the
    same normalised answer get the same grade from a deterministic grader). When no
    sample has an answer to vote on (a game, a tool-use episode: the outcome is the
    grade, not a final answer), the vote is over the grades: more than half passed
    (with one sample, its grade).
    """
    if len(answers) != len(passed):
        raise ValueError("answers and passed must have the same length")
    winner = majority_answer(answers)
    if winner is None:
        return 2 * sum(passed) > len(passed)
    return any(ok for a, ok in zip(answers, passed, strict=True) if a == winner)


def _resample_index(n: int, n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, size=(n_resamples, n))  # [R, N]


def bootstrap_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-task `values`.

    `statistic` maps an [R, N] array of resampled values to R statistics (default: the
    row mean). Returns (lo, hi); (nan, nan) for no values. Deterministic for a seed.
    """
    x = np.asarray(values, dtype=float)  # [N]
    if x.size == 0:
        return (math.nan, math.nan)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    samples = x[_resample_index(x.size, n_resamples, seed)]  # [R, N]
    stats = samples.mean(axis=1) if statistic is None else statistic(samples)  # [R]
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


@dataclass(frozen=True)
class PairedResult:
    """Difference `mean(b) - mean(a)` on the same tasks, with its bootstrap interval.

    `p_value` is two-sided: twice the share of resampled differences on the other side
    of zero from the observed one, within [1/n_resamples, 1] (the resolution of the
    bootstrap: a value at the floor means "at most that"); `n` is the number of tasks.
    """

    mean_a: float
    mean_b: float
    diff: float
    ci: tuple[float, float]
    p_value: float
    n: int


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> PairedResult:
    """Paired bootstrap of `mean(b) - mean(a)`: resample task indices, keep pairs together."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)  # [N], [N]
    if xa.shape != xb.shape:
        raise ValueError(f"paired scores differ in length: {xa.size} vs {xb.size}")
    if xa.size == 0:
        return PairedResult(math.nan, math.nan, math.nan, (math.nan, math.nan), math.nan, 0)
    delta = xb - xa  # [N]
    diffs = delta[_resample_index(delta.size, n_resamples, seed)].mean(axis=1)  # [R]
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(diffs, [alpha, 1.0 - alpha])
    observed = float(delta.mean())
    if observed > 0:
        tail = float((diffs <= 0).mean())
    elif observed < 0:
        tail = float((diffs >= 0).mean())
    else:
        tail = 0.5
    return PairedResult(
        mean_a=float(xa.mean()),
        mean_b=float(xb.mean()),
        diff=observed,
        ci=(float(lo), float(hi)),
        p_value=min(1.0, max(2.0 * tail, 1.0 / n_resamples)),
        n=int(delta.size),
    )


@dataclass(frozen=True)
class McNemarResult:
    """Discordant pairs and the exact two-sided McNemar p-value.

    `a_only`: tasks system A passes and B fails; `b_only`: the reverse.
    """

    a_only: int
    b_only: int
    p_value: float


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), in log space (no overflow for large n)."""
    if k < 0:
        return 0.0
    log_terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2)
        for i in range(min(k, n) + 1)
    ]
    top = max(log_terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in log_terms))


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> McNemarResult:
    """Exact McNemar test that systems A and B pass the same share of paired tasks."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} vs {len(b)}")
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    n = a_only + b_only
    p = 1.0 if n == 0 else min(1.0, 2.0 * _binom_cdf_half(min(a_only, b_only), n))
    return McNemarResult(a_only, b_only, p)
