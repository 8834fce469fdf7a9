"""Turn graded rollouts into the padded tensors the loss needs.

Layout of one micro-batch (shape letters from `rldojo.types`): each row is the prompt,
left padded to P, followed by the completion (policy and environment tokens), right
padded to T, so every row's completion starts at column P and the logits that predict
it are columns P-1 .. P+T-2 — one slice for the whole micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from rldojo.types import Rollout


@dataclass
class TokenBatch:
    """Padded tensors for a list of rollouts."""

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long
    position_ids: torch.Tensor  # [B, L] long
    prompt_len: int  # P
    completion_ids: torch.Tensor  # [B, T] long
    policy_mask: torch.Tensor  # [B, T] bool, True where the policy wrote the token
    behaviour_logprobs: torch.Tensor  # [B, T] float
    sampler_entropy: torch.Tensor  # [B, T] float (0 where unknown)
    group_index: torch.Tensor | None = None  # [B] long: rows with equal ids share the prompt
    versions: torch.Tensor | None = None  # [B] long: policy version that sampled each row

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, index: slice) -> TokenBatch:
        """A micro-batch of consecutive rows, trimmed of all-padding columns."""
        mask = self.attention_mask[index]  # [M, L]
        used = mask.any(0).nonzero()  # columns that hold at least one token
        first = min(int(used.min()), self.prompt_len - 1)
        policy = self.policy_mask[index]  # [M, T]
        t_keep = int(policy.any(0).nonzero().max()) + 1 if policy.any() else 1
        cols = slice(first, self.prompt_len + t_keep)
        return TokenBatch(
            input_ids=self.input_ids[index, cols],
            attention_mask=self.attention_mask[index, cols],
            position_ids=self.position_ids[index, cols],
            prompt_len=self.prompt_len - first,
            completion_ids=self.completion_ids[index, :t_keep],
            policy_mask=self.policy_mask[index, :t_keep],
            behaviour_logprobs=self.behaviour_logprobs[index, :t_keep],
            sampler_entropy=self.sampler_entropy[index, :t_keep],
            group_index=None if self.group_index is None else self.group_index[index],
            versions=None if self.versions is None else self.versions[index],
        )


def build_token_batch(
    rollouts: Sequence[Rollout], pad_id: int, group_ids: Sequence[int] | None = None
) -> TokenBatch:
    """Pad rollouts into one `TokenBatch` (prompts left, completions right)."""
    n = len(rollouts)
    p = max(len(r.prompt_ids) for r in rollouts)
    t = max(max(len(r.completion_ids) for r in rollouts), 1)
    input_ids = torch.full((n, p + t), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros((n, p + t), dtype=torch.long)  # [B, L]
    completion = torch.full((n, t), pad_id, dtype=torch.long)  # [B, T]
    policy_mask = torch.zeros((n, t), dtype=torch.bool)  # [B, T]
    logprobs = torch.zeros((n, t))  # [B, T]
    entropy = torch.zeros((n, t))  # [B, T]
    for row, r in enumerate(rollouts):
        lp, lc = len(r.prompt_ids), len(r.completion_ids)
        input_ids[row, p - lp : p] = torch.tensor(r.prompt_ids, dtype=torch.long)
        attention[row, p - lp : p + lc] = 1
        if lc:
            ids = torch.tensor(r.completion_ids, dtype=torch.long)
            input_ids[row, p : p + lc] = ids
            completion[row, :lc] = ids
            policy_mask[row, :lc] = torch.tensor(r.policy_mask, dtype=torch.bool)
            logprobs[row, :lc] = torch.tensor(r.logprobs)
            if r.entropies:
                entropy[row, :lc] = torch.tensor(r.entropies)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    groups = None if group_ids is None else torch.tensor(list(group_ids), dtype=torch.long)
    versions = torch.tensor([r.policy_version for r in rollouts], dtype=torch.long)  # [B]
    return TokenBatch(
        input_ids,
        attention,
        positions,
        p,
        completion,
        policy_mask,
        logprobs,
        entropy,
        groups,
        versions,
    )


def completion_logits(
    model: object, batch: TokenBatch, *, share_prefix: bool = True
) -> torch.Tensor:
    """Logits that predict each completion token: `[M, T, V]`.

    With `share_prefix`, rows of one group (same task, so the same prompt) run the prompt
    through the model once and attend to its key/value cache, instead of G times. This is
    exact, gradients included: the shared keys and values are indexed, not detached, so
    every row's gradient flows back through the one prompt pass. It removes (G-1)/G of the
    prompt compute, which dominates when prompts are longer than completions.
    """
    if share_prefix and batch.group_index is not None:
        shared = _shared_prefix_logits(model, batch)
        if shared is not None:
            return shared
    t = batch.completion_ids.shape[1]
    out = model(  # type: ignore[operator]
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=t + 1,
    )
    return out.logits[:, :-1]  # [M, T, V]


def _shared_prefix_logits(model: Any, batch: TokenBatch) -> torch.Tensor | None:
    assert batch.group_index is not None
    _, inverse = torch.unique(batch.group_index, return_inverse=True)  # [M] -> unique prompt
    first = torch.zeros(int(inverse.max()) + 1, dtype=torch.long)
    first.scatter_(0, inverse.flip(0), torch.arange(batch.size - 1, -1, -1))  # first row per group
    p = batch.prompt_len
    prompts = batch.input_ids[first, :p]  # [U, P]
    if not torch.equal(prompts[inverse], batch.input_ids[:, :p]):
        return None  # rows that claim a group do not share a prompt: use the plain path
    cache = DynamicCache()
    head = model(
        input_ids=prompts,
        attention_mask=batch.attention_mask[first, :p],
        position_ids=batch.position_ids[first, :p],
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    cache.batch_select_indices(inverse)  # differentiable gather of the prompt's keys/values
    tail = model(
        input_ids=batch.input_ids[:, p:],
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids[:, p:],
        cache=cache,
        use_cache=True,
    )
    first_logits = head.logits[inverse]  # [M, 1, V] predicts completion token 0
    return torch.cat([first_logits, tail.logits[:, :-1]], dim=1)  # [M, T, V]
