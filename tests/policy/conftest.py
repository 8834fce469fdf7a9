"""Fixtures shared by the policy tests: `sharp`, a tiny model whose greedy tokens depend
on the context (the sampler's and the decode engine's tests)."""

from __future__ import annotations

import copy

import pytest
import torch

from rldojo.policy.transformers_backend import TransformersPolicy

SHARP_TEXTS = [
    "hi",
    "what is 3+4? answer briefly",
    "x",
    "a much longer question about numbers, words and more words, so that this prompt is wider "
    "than the cache of the rows already decoding when it joins them",
    "count to ten",
]


@pytest.fixture(scope="module")
def sharp(tiny):
    """`(model, tokenizer, prompts)`: the tiny model with large random weights, in fp32
    (the tiny model's own greedy output is one token repeated), and `SHARP_TEXTS` as
    chat prompts."""
    model, tok = tiny
    model = copy.deepcopy(model).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() == 2:
                std = 0.5 if "embed" in name or "lm_head" in name else 0.3
                weight.copy_(torch.randn(weight.shape, generator=gen) * std)
    policy = TransformersPolicy(model, tok, generation_dtype=None)
    prompts = [policy.encode_chat([{"role": "user", "content": t}]) for t in SHARP_TEXTS]
    return model, tok, prompts
