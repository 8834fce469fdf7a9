"""`SAFE_SDPA`: left padding leaves real positions as they were and puts no NaN into
gradients, even under an attention kernel that returns NaN for a fully masked row (as
CUDA's cuDNN kernel does in bf16: `benchmarks/results/sdpa_padding_check_cuda.json`)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rldojo.policy.attention import SAFE_SDPA, safe_sdpa_mask
from rldojo.policy.models import load_model

pytestmark = pytest.mark.slow  # tiny-random forwards and backwards


def _left_padded(n: int = 3, length: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 500, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    for row in range(1, n):
        mask[row, : 3 * row] = 0  # rows 1.. start with padding
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}  # fmt: skip


def _naive_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """softmax(QK^T + mask) V with -inf for masked keys, a fully masked row's output set
    to zero: its forward is finite but its gradient is 0/0 = NaN, as with CUDA's cuDNN
    kernel in bf16 (the CPU's SDPA returns zeros and zero gradients instead)."""
    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    scores = query @ key.transpose(-1, -2) * (scaling or 1 / math.sqrt(query.shape[-1]))
    out = scores.softmax(-1) @ value  # [B, H, Q, D]
    if attention_mask is not None:
        weights = scores.masked_fill(~attention_mask, float("-inf")).softmax(-1)
        empty = ~attention_mask.any(-1, keepdim=True)  # [B, 1, Q, 1]: no key to attend to
        out = torch.where(empty, 0.0, weights @ value)
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def naive_attentions():
    for name, mask in (("naive_plain", sdpa_mask), ("naive_safe", safe_sdpa_mask)):
        AttentionInterface.register(name, _naive_attention)
        AttentionMaskInterface.register(name, mask)


def test_load_model_uses_safe_sdpa_and_real_positions_are_unchanged():
    model, _ = load_model("tiny-random")
    assert model.config._attn_implementation == SAFE_SDPA
    batch = _left_padded()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        safe = model(**batch).logits
        model.set_attn_implementation("sdpa")
        plain = model(**batch).logits
    assert torch.equal(safe[real], plain[real])
    assert torch.isfinite(safe).all()


def test_a_fully_masked_row_does_not_poison_the_gradient(naive_attentions):
    batch = _left_padded()
    real = batch["attention_mask"].bool()
    grads = {}
    for name in ("naive_plain", "naive_safe"):
        model, _ = load_model("tiny-random")
        model.set_attn_implementation(name)
        logits = model(**batch).logits
        loss = logits[real].logsumexp(-1).mean()  # real positions only
        loss.backward()
        assert torch.isfinite(loss)
        grads[name] = [p.grad for p in model.parameters() if p.grad is not None]
    # The plain mask: the padding rows' NaN reaches every weight through the backward.
    assert any(g.isnan().any() for g in grads["naive_plain"])
    assert all(torch.isfinite(g).all() for g in grads["naive_safe"])
