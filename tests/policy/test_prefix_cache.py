"""Cross-turn KV reuse (`generation.prefix_cache_mb`): a turn that continues the last
call's conversation prefills only its new tokens and samples what a full prefill samples;
changed weights, a skipped turn or the memory cap mean no reuse."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from rldojo.envs.registry import make_env
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # samples from tiny-random

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)


def _policies(tiny, **kwargs):
    model, tok = tiny
    model = copy.deepcopy(model)
    cached = TransformersPolicy(model, tok, generation_dtype=None, prefix_cache_mb=64, **kwargs)
    plain = TransformersPolicy(model, tok, generation_dtype=None, **kwargs)
    return model, cached, plain


def _openings(policy):
    texts = ["count to five", "name a colour", "count to five", "2+2?"]  # two alike
    return [policy.encode_chat([{"role": "user", "content": t}]) for t in texts]


def _next_turn(policy, prompts, completions, text="and then?"):
    """Each conversation continued: its sampled ids, then the template's tokens of a new
    user message (as `collect_rollouts` builds them)."""
    reply = policy.encode_chat([{"role": "user", "content": text}])
    return [p + list(c.token_ids) + reply for p, c in zip(prompts, completions, strict=True)]


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)


def test_a_next_turn_reuses_the_last_turns_keys_and_samples_the_same(tiny):
    _, cached, plain = _policies(tiny)
    openings = _openings(cached)
    first = cached.generate(openings, SAMPLED)
    _assert_same(first, plain.generate(openings, SAMPLED))
    assert cached.prefix_cache.reused_tokens == 0
    second = _next_turn(cached, openings, first)
    for params in (GREEDY, SAMPLED):
        if params is SAMPLED:  # a fresh turn 1 to continue from again
            cached.generate(openings, SAMPLED)
        reused_before = cached.prefix_cache.reused_tokens
        _assert_same(cached.generate(second, params), plain.generate(second, params))
        # every row, the two alike included, continued from its cached turn (all but the
        # last sampled token: it was never fed)
        expected = sum(len(p) + len(c.token_ids) - 1 for p, c in zip(openings, first, strict=True))
        assert cached.prefix_cache.reused_tokens - reused_before == expected


def test_changed_weights_or_a_skipped_turn_reuse_nothing(tiny):
    model, cached, plain = _policies(tiny)
    openings = _openings(cached)
    first = cached.generate(openings, GREEDY)
    with torch.no_grad():  # an optimizer step, without update_weights
        for p in model.parameters():
            p.mul_(1.5)
    second = _next_turn(cached, openings, first)
    _assert_same(cached.generate(second, GREEDY), plain.generate(second, GREEDY))
    assert cached.prefix_cache.reused_tokens == 0

    first = cached.generate(openings, GREEDY)
    other = cached.encode_chat([{"role": "user", "content": "something else"}])
    cached.generate([other], GREEDY)  # another conversation's call in between
    cached.generate(_next_turn(cached, openings, first), GREEDY)
    assert cached.prefix_cache.reused_tokens == 0  # only the last call's turns are kept


def test_nothing_is_stored_past_the_memory_cap(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, generation_dtype=None, prefix_cache_mb=1)
    policy.prefix_cache.max_bytes = 1024  # below one conversation's keys and values
    openings = _openings(policy)
    first = policy.generate(openings, GREEDY)
    policy.generate(_next_turn(policy, openings, first), GREEDY)
    assert policy.prefix_cache.reused_tokens == 0


def test_multi_turn_games_play_the_same_with_the_cache(tiny):
    """Tic-tac-toe episodes through the rollout engine: tiny-random plays illegal moves,
    so each game runs turns until it forfeits, each continuing the last."""
    model, tok = tiny
    env_kwargs = {"opponent_depth": 0, "max_illegal": 3}
    tasks = make_env("tictactoe-v1", **env_kwargs).tasks("test", n=6)

    def play(policy):
        requests = [(t, 0, i) for i, t in enumerate(tasks)]
        return asyncio.run(collect_rollouts(lambda: make_env("tictactoe-v1", **env_kwargs),
                                            policy, requests, GREEDY))  # fmt: skip

    def policy(mb):
        return TransformersPolicy(copy.deepcopy(model), tok, generation_dtype=torch.float32,
                                  prefix_cache_mb=mb)  # fmt: skip

    cached = policy(64)
    with_cache, without = play(cached), play(policy(0))
    assert all(r.info["game/illegal_moves"] >= 2 for r in without)  # multi-turn
    # `collect_rollouts` plays through the engine (`agenerate`) when the policy has one, so
    # the engine's lasting cache served the turns; in lockstep, `generate`'s per-call one
    assert cached.prefix_cache.reused_tokens + cached.engine_stats()["reused_tokens"] > 0
    for a, b in zip(with_cache, without, strict=True):
        assert a.status == b.status
        assert a.completion_ids == b.completion_ids


def test_every_native_sampler_of_a_run_gets_the_configured_cache(tiny):
    """The trainer's sampler and Ray workers' take `generation.prefix_cache_mb`."""
    from rldojo.cluster.ray_pool import WorkerSampler, build_sampler
    from rldojo.config import load_config
    from rldojo.policy.training_model import make_policy

    model, tok = tiny
    for mb in (0, 16):
        cfg = load_config(None, ["model.name=tiny-random", f"generation.prefix_cache_mb={mb}"])
        policies = [make_policy(cfg, model, tok, torch.float32),
                    build_sampler(model, tok, WorkerSampler(prefix_cache_mb=mb))]  # fmt: skip
        for policy in policies:
            cache = policy.prefix_cache
            assert (cache.max_bytes if cache else 0) == mb << 20
