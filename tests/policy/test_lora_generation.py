"""Under LoRA the trainer's transient generation copy is a plain model with the adapters
merged: it samples exactly what peft's own merge samples, follows the adapters as they
train, and leaves the trained model as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from rldojo.config import LoraSection
from rldojo.policy import lora
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # tiny-random with adapters, sampling

pytest.importorskip("peft", reason="the `lora` extra (peft) is not installed")

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def _adapted(tiny):
    model, tok = tiny
    wrapped = lora.add_lora(copy.deepcopy(model), LoraSection(r=4, alpha=8, layers=[1]), "t")
    _move_adapters(wrapped, seed=0)
    return wrapped, tok


def _move_adapters(model, seed: int) -> None:
    """An "optimizer step" on the adapters alone (B starts at 0: no delta yet)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=gen))


def _merged_reference(model, tok, ids):
    """What a bf16 plain model with peft's merge of the current adapters samples."""
    plain = lora.merged_copy(model).to(torch.bfloat16)
    return TransformersPolicy(plain, tok, generation_dtype=None).generate([ids], GREEDY)[0]


def test_transient_copy_of_a_lora_model_is_the_merged_plain_model(tiny):
    model, tok = _adapted(tiny)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    policy = TransformersPolicy(model, tok, generation_dtype=torch.bfloat16,
                                transient_copy=True)  # fmt: skip
    names = [name for name, _ in policy._gen_model.named_parameters()]
    assert names and not any("lora_" in n or "base_layer" in n for n in names)
    assert all(p.numel() == 0 for p in policy._gen_model.parameters())  # transient

    ids = policy.encode_chat([{"role": "user", "content": "count to five"}])
    first = policy.generate([ids], GREEDY)[0]
    reference = _merged_reference(model, tok, ids)
    assert first.token_ids == reference.token_ids
    assert first.logprobs == reference.logprobs
    for name, p in model.named_parameters():  # the merge is computed, not done in place
        assert torch.equal(p, before[name]), name
    assert not any(m.merged for m in model.modules() if hasattr(m, "merged_adapters"))

    _move_adapters(model, seed=1)
    policy.update_weights()
    after = policy.generate([ids], GREEDY)[0]
    assert after.token_ids == _merged_reference(model, tok, ids).token_ids
    assert after.token_ids != first.token_ids  # the new adapters were used


def test_merge_lora_false_keeps_the_adapter_modules(tiny):
    model, tok = _adapted(tiny)
    policy = TransformersPolicy(model, tok, generation_dtype=torch.bfloat16,
                                transient_copy=True, merge_lora=False)  # fmt: skip
    assert any("lora_" in n for n, _ in policy._gen_model.named_parameters())
    ids = policy.encode_chat([{"role": "user", "content": "count to five"}])
    assert len(policy.generate([ids], GREEDY)[0].token_ids) > 0
