"""Turn graded rollouts into the padded tensors the loss needs.

Layout of one micro-batch (shape letters from `rldojo.types`): each row is the prompt,
left padded to P, followed by the completion (policy and environment tokens), right
padded to T, so every row's completion starts at column P and the logits that predict
it are columns P-1 .. P+T-2 — one slice for the whole micro-batch.

A batch is built on the host; the update moves each micro-batch to the model's device
(`TokenBatch.to`) after `rows` has sliced it, so the slicing's bookkeeping never waits
on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from rldojo.policy.models import cache_kwargs
from rldojo.training.activations import with_own_gradients
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

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on `device` (itself when it is there already: no copy on CPU).
        `group_index` stays on the host: it only steers the prompt sharing's indexing."""
        if self.input_ids.device == torch.device(device):
            return self
        versions = None if self.versions is None else self.versions.to(device)
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.prompt_len,
            self.completion_ids.to(device),
            self.policy_mask.to(device),
            self.behaviour_logprobs.to(device),
            self.sampler_entropy.to(device),
            self.group_index,
            versions,
        )

    def rows(self, index: slice | list[int]) -> TokenBatch:
        """A micro-batch of rows (consecutive, or listed), trimmed of all-padding columns."""
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


# Model types whose causal-LM forward is exactly `lm_head(decoder(...).last_hidden_state)`
# (no logit soft-capping or scaling), so the output layer can run on chosen positions only.
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2", "phi3", "starcoder2"}
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
    return _completion_forward(model, batch, share_prefix=share_prefix, head=True)


def splits_output_layer(model: Any) -> bool:
    """Whether `selected_logits` can run the output layer on chosen positions alone."""
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
        and callable(getattr(model, "get_decoder", None))
        and isinstance(getattr(model, "get_output_embeddings", lambda: None)(), torch.nn.Linear)
    )


def selected_logits(
    model: Any, batch: TokenBatch, where: torch.Tensor, *, share_prefix: bool = True
) -> torch.Tensor:
    """Logits `[N, V]` of the completion positions where `where` `[M, T]` is True, in
    row-major order: `completion_logits(...)[where]`, with the output layer (the 49k-vocab
    matmul, 21% of SmolLM2's weights) run on those N positions alone.

    The policy loss reads log-probs only at the tokens that carry gradient (the top-ρ
    forking tokens), so computing the vocabulary projection and its log-softmax at the
    other 1-ρ of the positions is wasted work, forward and backward. Needs
    `splits_output_layer(model)`; the decoder and the prompt sharing are unchanged."""
    if not splits_output_layer(model):
        raise ValueError(f"{type(model).__name__}: output layer cannot be split off")
    hidden = _completion_forward(model, batch, share_prefix=share_prefix, head=False)  # [M,T,H]
    # Its own gradient path: with tied embeddings its weight gradient is added now, not
    # held until the input embedding's (at the end of the backward).
    return with_own_gradients(model.get_output_embeddings())(hidden[where])  # [N, V]


def _completion_forward(
    model: Any, batch: TokenBatch, *, share_prefix: bool, head: bool
) -> torch.Tensor:
    """`[M, T, V]` logits (`head`) or `[M, T, H]` final hidden states predicting each
    completion token."""
    if share_prefix and batch.group_index is not None:
        shared = _shared_prefix_forward(model, batch, head)
        if shared is not None:
            return shared
    t = batch.completion_ids.shape[1]
    inputs = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "use_cache": False,
    }
    if head:
        return model(**inputs, logits_to_keep=t + 1).logits[:, :-1]  # [M, T, V]
    hidden = model.get_decoder()(**inputs).last_hidden_state  # [M, L, H]
    return hidden[:, -t - 1 : -1]  # [M, T, H]


def _shared_prefix_forward(model: Any, batch: TokenBatch, head: bool) -> torch.Tensor | None:
    assert batch.group_index is not None
    # The group structure is worked out on the host (group_index stays there) and the
    # two index vectors moved once: no GPU round trip for the bookkeeping.
    _, inverse = torch.unique(batch.group_index, return_inverse=True)  # [M] -> unique prompt
    first = torch.zeros(int(inverse.max()) + 1, dtype=torch.long)
    first.scatter_(0, inverse.flip(0), torch.arange(batch.size - 1, -1, -1))  # first row per group
    device = batch.input_ids.device
    first, inverse = first.to(device), inverse.to(device)
    p = batch.prompt_len
    prompts = batch.input_ids[first, :p]  # [U, P]
    if not torch.equal(prompts[inverse], batch.input_ids[:, :p]):
        return None  # rows that claim a group do not share a prompt: use the plain path
    cache = DynamicCache()
    net = model if head else model.get_decoder()
    extra = {"logits_to_keep": 1} if head else {}
    head_out = with_own_gradients(net)(
        input_ids=prompts,
        attention_mask=batch.attention_mask[first, :p],
        position_ids=batch.position_ids[first, :p],
        **cache_kwargs(net, cache),
        use_cache=True,
        **extra,
    )
    cache.batch_select_indices(inverse)  # differentiable gather of the prompt's keys/values
    tail = net(
        input_ids=batch.input_ids[:, p:],
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids[:, p:],
        **cache_kwargs(net, cache),
        use_cache=True,
    )
    if head:
        first_out, rest = head_out.logits[inverse], tail.logits  # [M, 1, V], [M, T, V]
    else:  # the prompt's last hidden state predicts completion token 0
        first_out = head_out.last_hidden_state[inverse, -1:]  # [M, 1, H]
        rest = tail.last_hidden_state  # [M, T, H]
    return torch.cat([first_out, rest[:, :-1]], dim=1)  # [M, T, V] or [M, T, H]
