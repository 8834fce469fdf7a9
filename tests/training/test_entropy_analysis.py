"""Entropy analysis on the tiny model: teacher-forced entropies, statistics, overlap, ledger."""

from __future__ import annotations

import asyncio
import copy
import math

import numpy as np
import pytest
import torch

from rldojo.envs.registry import make_env
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts
from rldojo.store.ledger import Ledger
from rldojo.training.entropy_analysis import (
    entropy_change_by_bucket,
    entropy_markdown,
    entropy_report,
    position_overlap,
    sequences_from_ledger,
    teacher_forced_entropy,
    top_positions,
)
from rldojo.types import Rollout, SamplingParams, Score

pytestmark = pytest.mark.slow  # tiny-random forwards


@pytest.fixture(scope="module")
def sampled(tiny):
    model, tokenizer = tiny
    policy = TransformersPolicy(model, tokenizer, generation_dtype=None)  # fp32, like the forward
    tasks = make_env("arith-v1").tasks("test", n=5)
    requests = [(t, 0, i) for i, t in enumerate(tasks)]
    sampling = SamplingParams(max_new_tokens=10, temperature=0.8, seed=0)
    return asyncio.run(collect_rollouts(lambda: make_env("arith-v1"), policy, requests, sampling))


def test_teacher_forced_entropy_matches_the_sampler_and_ignores_batching(tiny, sampled):
    model, _ = tiny
    ents = teacher_forced_entropy(model, sampled, temperature=0.8, micro_batch=2)
    for e, r in zip(ents, sampled, strict=True):
        assert e.shape == (len(r.completion_ids),)
        np.testing.assert_allclose(e, np.array(r.entropies), rtol=1e-3, atol=1e-3)
    one_by_one = teacher_forced_entropy(model, sampled, temperature=0.8, micro_batch=1)
    for a, b in zip(ents, one_by_one, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    hotter = teacher_forced_entropy(model, sampled[:1], temperature=2.0)
    assert hotter[0].mean() > ents[0].mean()  # a higher temperature flattens the distribution


def _rollout(n: int, mask=None) -> Rollout:
    return Rollout("t", "e", [], "", (1,), tuple(range(10, 10 + n)), mask or (True,) * n)


def test_top_positions_overlap_and_buckets_on_hand_made_entropies():
    rollouts = [_rollout(5), _rollout(5, (True, True, True, False, False))]
    base = [np.array([0.0, 0.1, 2.0, 3.0, 0.5]), np.array([1.5, 0.0, 0.2, 9.0, 9.0])]
    top = top_positions(base, rollouts, rho=0.25)  # 8 policy tokens -> k = 2: 3.0 and 2.0
    assert top.sum() == 2 and top[0, 3] and top[0, 2] and not top[1, 3]  # masked 9.0 ignored
    same = position_overlap(base, base, rollouts, 0.25)
    assert same["overlap"] == 1.0 and same["jaccard"] == 1.0 and same["chance"] == 0.25
    moved = [np.array([0.0, 0.1, 2.0, 0.0, 0.5]), base[1]]  # position (0, 3) drops out
    assert position_overlap(base, moved, rollouts, 0.25)["overlap"] == 0.5
    buckets = entropy_change_by_bucket(base, [b + 1.0 for b in base], rollouts, buckets=4)
    assert sum(b["count"] for b in buckets) == 8
    assert all(b["mean_change"] == pytest.approx(1.0) for b in buckets)
    assert buckets[0]["mean_base"] <= buckets[-1]["mean_base"]


def test_report_compares_two_models_on_the_same_sequences(tiny, sampled):
    model, tokenizer = tiny
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    base = teacher_forced_entropy(model, sampled)
    new = teacher_forced_entropy(other, sampled)
    report = entropy_report(tokenizer, sampled, base, rho=0.2, compare=new)
    n_tokens = sum(sum(r.policy_mask) for r in sampled)
    assert report["stats"]["count"] == n_tokens
    assert {"p50", "p80", "p95", "frac_below_0.01"} <= set(report["stats"])
    assert report["paper"] == {"frac_below_0.01": 0.5, "p80": 0.672}
    forking = report["forking_tokens"]
    assert sum(t["count"] for t in forking) >= math.ceil(0.2 * n_tokens) or len(forking) == 20
    assert all(isinstance(t["token"], str) for t in forking + report["low_entropy_tokens"])
    assert report["sampler_vs_forward_mean_abs_diff"] < 0.05
    overlap = report["compare"]["overlap"]["overlap"]
    assert 0.0 <= overlap <= 1.0
    md = entropy_markdown(report, labels=("base", "trained"))
    assert "| p80 | 0.672 |" in md and "overlap" in md and "| 0-20% |" in md


def test_sequences_from_ledger(tmp_path, sampled):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add(1, sampled, [Score(0.0)] * len(sampled))
    ledger.close()
    back = sequences_from_ledger(tmp_path, limit=3)
    assert len(back) == 3
    assert back[0].completion_ids == sampled[0].completion_ids
    assert back[0].prompt_ids == sampled[0].prompt_ids
    assert back[0].policy_mask == sampled[0].policy_mask
    assert sequences_from_ledger(tmp_path / "ledger.sqlite", step=2) == []
    with pytest.raises(FileNotFoundError):
        sequences_from_ledger(tmp_path / "nope")
