"""Token batches: padding layout, micro-batch trimming, and exact prompt sharing."""

from __future__ import annotations

import pytest
import torch

from rldojo.training.batch import build_token_batch, completion_logits
from rldojo.types import Rollout

pytestmark = pytest.mark.slow  # tiny-random forwards


def _rollout(prompt: list[int], completion: list[int], mask: list[bool] | None = None) -> Rollout:
    mask = mask or [True] * len(completion)
    return Rollout(
        "t",
        "e",
        [],
        "",
        tuple(prompt),
        tuple(completion),
        tuple(mask),
        tuple(0.1 * i for i in range(len(completion))),
    )


ROLLOUTS = [
    _rollout([5, 6, 7], [8, 9]),
    _rollout([5, 6, 7], [10, 11, 12]),
    _rollout([1, 2, 3, 4, 5], [3]),
    _rollout([1, 2, 3, 4, 5], [4, 4, 4, 4], [True, False, False, True]),
]


def test_layout_left_pads_prompts_and_right_pads_completions():
    b = build_token_batch(ROLLOUTS, pad_id=0, group_ids=[0, 0, 1, 1])
    assert b.prompt_len == 5
    assert b.input_ids[0].tolist() == [0, 0, 5, 6, 7, 8, 9, 0, 0]
    assert b.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert b.position_ids[0, 2:7].tolist() == [0, 1, 2, 3, 4]
    assert b.policy_mask[3].tolist() == [True, False, False, True]
    assert b.completion_ids[2].tolist() == [3, 0, 0, 0]
    sub = b.rows(slice(0, 2))
    assert sub.prompt_len == 3  # all-padding prompt columns trimmed
    assert sub.completion_ids.shape[1] == 3  # beyond the last policy token trimmed


def _loss_and_grads(model, batch, share: bool):
    model.zero_grad()
    logits = completion_logits(model, batch, share_prefix=share)
    loss = (logits.float().logsumexp(-1) * batch.policy_mask).sum()
    loss.backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def test_shared_prompt_forward_is_exact_with_gradients(tiny):
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    plain, g_plain = _loss_and_grads(model, batch, share=False)
    shared, g_shared = _loss_and_grads(model, batch, share=True)
    mask = batch.policy_mask
    assert torch.allclose(plain[mask], shared[mask], atol=1e-5)
    for a, b in zip(g_plain, g_shared, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_shared_prompt_falls_back_when_prompts_differ(tiny):
    model, tok = tiny
    wrong = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 1, 0, 1])
    plain = completion_logits(model, wrong, share_prefix=False)
    shared = completion_logits(model, wrong, share_prefix=True)
    assert torch.allclose(plain, shared)
