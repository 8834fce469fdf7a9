"""Evaluation statistics against enumeration, simulation and known values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rldojo.eval.stats import (
    bootstrap_ci,
    majority_answer,
    majority_correct,
    mcnemar,
    paired_bootstrap,
    pass_at_k,
)


def _brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_enumeration_of_all_k_subsets(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # Large n would overflow math.comb-based floats; the product form stays finite.
    assert 0.0 < pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_majority_vote_ties_and_correctness():
    assert majority_answer(["3", None, "4", "4", "3"]) == "3"  # tie: first seen wins
    assert majority_answer([None, None]) is None
    assert majority_correct(["5", "5", "6"], [True, True, False])
    assert not majority_correct(["5", "6", "6"], [True, False, False])
    assert not majority_correct([None, None], [False, False])
    # No answer to vote on (a game, a tool episode): the vote is over the grades.
    assert majority_correct([None], [True])
    assert majority_correct([None, None, None], [True, False, True])
    assert not majority_correct([None, None], [True, False])  # a tie is not a majority


@pytest.mark.slow
def test_bootstrap_interval_coverage_on_synthetic_binomial_data():
    # 95% intervals of a mean should cover the true mean about 95% of the time.
    rng = np.random.default_rng(0)
    p, n, reps = 0.3, 200, 300
    covered = 0
    for rep in range(reps):
        values = (rng.random(n) < p).astype(float)
        lo, hi = bootstrap_ci(values, n_resamples=1000, seed=rep)
        covered += lo <= p <= hi
    assert 0.90 <= covered / reps <= 0.99
    # ...and its width matches the "±7 points for 200 questions" near p = 0.5.
    lo, hi = bootstrap_ci([1.0] * 100 + [0.0] * 100, n_resamples=2000)
    assert (hi - lo) / 2 == pytest.approx(0.069, abs=0.01)


def test_bootstrap_empty_and_deterministic():
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    assert bootstrap_ci([0, 1, 1], seed=3) == bootstrap_ci([0, 1, 1], seed=3)


def test_paired_bootstrap_detects_a_real_difference_and_not_a_fake_one():
    rng = np.random.default_rng(1)
    a = (rng.random(300) < 0.5).astype(float)
    better = np.where(rng.random(300) < 0.3, 1.0, a)  # B fixes ~30% of A's failures
    result = paired_bootstrap(a, better)
    assert result.diff > 0 and result.ci[0] > 0 and result.p_value < 0.01
    same = paired_bootstrap(a, a)
    assert same.diff == 0 and same.p_value == 1.0
    with pytest.raises(ValueError):
        paired_bootstrap([1, 0], [1])


def test_mcnemar_exact_values():
    # 10 vs 2 discordant pairs: two-sided exact p = 2 * P(X <= 2 | n=12, 1/2) = 0.03857
    result = mcnemar([True] * 10 + [False] * 2 + [True] * 5, [False] * 10 + [True] * 2 + [True] * 5)
    assert (result.a_only, result.b_only) == (10, 2)
    assert result.p_value == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar([True, False], [True, False]).p_value == 1.0
    assert mcnemar([True] * 600, [False] * 600).p_value < 1e-100  # no overflow
