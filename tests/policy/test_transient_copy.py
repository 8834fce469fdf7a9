"""The trainer's bf16 generation copy is transient: weights only during `generate`,
always the trained model's current ones, sampling exactly as a lasting copy does."""

from __future__ import annotations

import copy

import pytest
import torch

from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # samples from tiny-random

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def _held_bytes(policy: TransformersPolicy) -> int:
    return sum(p.numel() * p.element_size() for p in policy._gen_model.parameters())


def test_transient_copy_samples_like_a_lasting_one_and_follows_updates(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    transient = TransformersPolicy(model, tok, generation_dtype=torch.bfloat16,
                                   transient_copy=True)  # fmt: skip
    ids = transient.encode_chat([{"role": "user", "content": "count to five"}])
    assert _held_bytes(transient) == 0  # nothing held between calls
    lasting = TransformersPolicy(model, tok, generation_dtype=torch.bfloat16)
    assert _held_bytes(lasting) > 0
    first = transient.generate([ids], GREEDY)[0]
    assert first.token_ids == lasting.generate([ids], GREEDY)[0].token_ids
    assert first.logprobs == lasting.generate([ids], GREEDY)[0].logprobs
    assert _held_bytes(transient) == 0  # freed again after the call

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an "optimizer step" on the trained model
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    transient.update_weights()
    assert transient.version == 1
    fresh = TransformersPolicy(model, tok, generation_dtype=torch.bfloat16)
    after = transient.generate([ids], GREEDY)[0]
    assert after.token_ids == fresh.generate([ids], GREEDY)[0].token_ids
    assert after.token_ids != first.token_ids  # the new weights were used


def test_asynchronous_sampler_keeps_a_lasting_copy(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, generation_dtype=torch.bfloat16,
                                separate_copy=True, transient_copy=True)  # fmt: skip
    assert _held_bytes(policy) > 0  # it samples while the trainer changes the weights
