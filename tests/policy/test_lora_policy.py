"""The sampler sees the adapted weights: with LoRA, a generation copy (bf16 or
asynchronous) receives the trained adapters on `update_weights`, and the shared-weights
policy samples through them directly."""

from __future__ import annotations

import pytest
import torch

from rldojo.config import LoraSection
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # tiny-random with adapters, sampling

pytest.importorskip("peft", reason="the `lora` extra (peft) is not installed")


def _adapted(tiny):
    import copy

    from rldojo.policy.lora import add_lora

    model, tokenizer = tiny
    return add_lora(copy.deepcopy(model), LoraSection(r=4), "tiny-random"), tokenizer


def _perturb_adapters(model) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p))


def _greedy(policy, ids):
    return policy.generate([ids], SamplingParams(max_new_tokens=8, temperature=0.0))[0].token_ids


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_generation_copy_receives_adapter_weights(tiny, dtype):
    model, tokenizer = _adapted(tiny)
    copied = TransformersPolicy(model, tokenizer, generation_dtype=dtype, separate_copy=True)
    shared = TransformersPolicy(model, tokenizer, generation_dtype=None)
    ids = copied.encode_chat([{"role": "user", "content": "hi"}])
    _perturb_adapters(model)
    published = copied._published_weights()
    assert published and all("lora_" in k for k in published)  # only the adapters travel
    copied.update_weights()
    assert copied.version == 1
    gen = dict(copied._gen_model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(gen[name].float(), p.to(gen[name].dtype).float()), name
    if dtype is None:  # same dtype: the copy samples exactly as the trained model
        assert _greedy(copied, ids) == _greedy(shared, ids)


def test_full_model_publishes_the_whole_state_dict(tiny):
    import copy

    model, tokenizer = tiny
    policy = TransformersPolicy(copy.deepcopy(model), tokenizer, generation_dtype=None,
                                separate_copy=True)  # fmt: skip
    assert set(policy._published_weights()) == set(model.state_dict())
