"""Turn graded rollouts into the padded tensors the loss needs.

Layout of one micro-batch (shape letters from `rldojo.types`): each row is the prompt,
left padded to P, followed by the completion (policy and environment tokens), right
padded to T, so every row's completion starts at column P and the logits that predict
it are columns P-1 .. P+T-2 — one slice for the whole micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

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
        )


def build_token_batch(rollouts: Sequence[Rollout], pad_id: int) -> TokenBatch:
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
    return TokenBatch(
        input_ids, attention, positions, p, completion, policy_mask, logprobs, entropy
    )


def completion_logits(model: object, batch: TokenBatch) -> torch.Tensor:
    """Logits that predict each completion token: `[M, T, V]`."""
    t = batch.completion_ids.shape[1]
    out = model(  # type: ignore[operator]
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=t + 1,
    )
    return out.logits[:, :-1]  # [M, T, V]
