"""Loss math for RL fine-tuning: entropy, forking-token selection, advantages, PPO loss.

Everything here is a pure function of tensors (no trainer state, no model), so each piece
can be tested against a hand computation and reused by any trainer. The flow per step is:

1. `logprobs_and_entropy` turns policy logits into per-token log-probs (with gradient) and
   entropies (without), chunked so bf16 logits are never upcast to fp32 all at once.
2. `high_entropy_mask` keeps the top-ρ "forking" tokens by entropy among policy tokens
   (Wang et al. 2025, "Beyond the 80/20 Rule"); docs/architecture.md, "The forking-token
   rule", states its exact semantics.
3. `group_advantages` computes GRPO-style group-normalised advantages (Shao et al. 2024).
4. `policy_loss` is the clipped surrogate with clip-higher and token-level aggregation
   (DAPO, Yu et al. 2025), optional dual clip (Ye et al. 2020) and k3 KL (Schulman 2020).

Shape letters follow the glossary in `rldojo.types` (B, T, V, M).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

Scope = Literal["batch", "microbatch", "sequence"]
Normaliser = Literal["selected", "all"]

_CEIL_GUARD = 1e-9
"""Subtracted before ceil(ρ·N) so that float error (0.3·10 = 3.0000000000000004) gives 3."""


# --------------------------------------------------------------------------- entropy


def _entropy_from_logp(logp: Tensor) -> Tensor:
    """Entropy over the last dim from fp32 log-probs; safe where a log-prob is -inf."""
    # clamp turns -inf into a finite number so that 0 * log 0 is 0, not NaN.
    finite_logp = logp.clamp_min(torch.finfo(logp.dtype).min)  # [..., V]
    return -(logp.exp() * finite_logp).sum(dim=-1)  # [...]


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy (nats) of softmax(logits / temperature) over the last dim, in >= fp32.

    `logits` [..., V] of any float dtype; returns [...] float32 (float64 kept). For
    whole-batch logits prefer `logprobs_and_entropy`, which works chunk by chunk.
    """
    _check_temperature(temperature)
    logp = torch.log_softmax(_upcast(logits) / temperature, dim=-1)  # [..., V]
    return _entropy_from_logp(logp)  # [...]


def _upcast(x: Tensor) -> Tensor:
    """At least fp32 (bf16/fp16 are upcast, fp64 is kept)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_temperature(temperature: float) -> None:
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


class _ChunkedLogprobs(torch.autograd.Function):
    """Token log-probs (differentiable) and entropies (not), computed chunk by chunk.

    Autograd on a plain chunked loop would save every chunk's fp32 softmax for backward,
    which adds up to a full fp32 copy of the logits. This function saves only the
    original logits and recomputes each chunk's softmax in backward instead.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, token_ids: Tensor, temperature: float, chunk_size: int
    ) -> tuple[Tensor, Tensor]:
        flat = logits.reshape(-1, logits.shape[-1])  # [M*T, V]
        ids = token_ids.reshape(-1, 1)  # [M*T, 1]
        dtype = torch.promote_types(flat.dtype, torch.float32)
        logp = flat.new_empty(flat.shape[0], dtype=dtype)  # [M*T]
        entropy = torch.empty_like(logp)  # [M*T]
        for start in range(0, flat.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            z = _upcast(flat[rows]) / temperature  # [C, V]
            logp_all = torch.log_softmax(z, dim=-1)  # [C, V]
            logp[rows] = logp_all.gather(1, ids[rows]).squeeze(1)  # [C]
            entropy[rows] = _entropy_from_logp(logp_all)  # [C]
        ctx.save_for_backward(flat, ids)
        ctx.temperature, ctx.chunk_size, ctx.shape = temperature, chunk_size, logits.shape
        logp, entropy = logp.view(token_ids.shape), entropy.view(token_ids.shape)  # [M, T]
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_logp: Tensor, _grad_entropy: Tensor
    ) -> tuple[Tensor, None, None, None]:
        flat, ids = ctx.saved_tensors  # [M*T, V], [M*T, 1]
        go = _upcast(grad_logp.reshape(-1, 1))  # [M*T, 1]
        grad = torch.empty_like(flat)  # [M*T, V]
        for start in range(0, flat.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            z = _upcast(flat[rows]) / ctx.temperature  # [C, V]
            # d log p_y / d z = onehot(y) - softmax(z); then the chain rule through 1/τ.
            g = torch.softmax(z, dim=-1).mul_(-go[rows])  # [C, V]
            g.scatter_add_(1, ids[rows], go[rows])  # [C, V]
            grad[rows] = g.div_(ctx.temperature)  # [C, V]
        return grad.view(ctx.shape), None, None, None


def logprobs_and_entropy(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[Tensor, Tensor]:
    """Log-prob of each sampled token and the policy entropy, both at `temperature`.

    `logits` [M, T, V] (any float dtype, typically bf16), `token_ids` [M, T] long.
    Returns `(logprobs, entropy)`, both [M, T] float32 (float64 for float64 logits).
    Gradient flows into `logits` through `logprobs` only; `entropy` is detached. The M*T
    rows are processed `chunk_size` at a time, so at most one chunk is ever upcast to
    fp32 (forward and backward); the gradient w.r.t. `logits` has the logits' dtype.
    """
    _check_temperature(temperature)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match ids {tuple(token_ids.shape)}")
    logp, entropy = _ChunkedLogprobs.apply(logits, token_ids, temperature, chunk_size)
    return logp, entropy  # [M, T], [M, T]


# ----------------------------------------------------------------- forking tokens


def _top_count(rho: float, n: int) -> int:
    """k = ceil(ρ·N), at least 1 and at most N (for N >= 1)."""
    return min(n, max(1, math.ceil(rho * n - _CEIL_GUARD)))


def _threshold_tensor(entropy: Tensor, mask: Tensor, rho: float) -> Tensor | None:
    """The k-th largest masked entropy as a 0-d tensor, or None when nothing is masked."""
    values = entropy[mask]  # [N]
    n = values.numel()
    if n == 0:
        return None
    # k-th largest is the (N-k+1)-th smallest; kthvalue has no 2^24 limit, unlike quantile.
    return torch.kthvalue(values, n - _top_count(rho, n) + 1).values  # []


def _check_mask_args(entropy: Tensor, mask: Tensor, rho: float) -> None:
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} differ")


def high_entropy_threshold(entropy: Tensor, mask: Tensor, rho: float) -> float | None:
    """The batch-scope entropy threshold (k-th largest masked entropy), for logging.

    `entropy` and `mask` share a shape (usually [B, T]). None when no token is masked.
    """
    _check_mask_args(entropy, mask, rho)
    threshold = _threshold_tensor(entropy, mask.bool(), rho)
    return None if threshold is None else float(threshold.item())


def _select_per_row(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """Sequence scope, vectorised: each row keeps its own top ceil(ρ·N_row) tokens."""
    n = mask.sum(dim=1)  # [B]
    k = torch.ceil(rho * n.double() - _CEIL_GUARD).long().clamp(min=1)  # [B]
    k = torch.minimum(k, n.clamp(min=1))  # [B]
    ranked = entropy.masked_fill(~mask, -math.inf).sort(dim=1, descending=True).values  # [B, T]
    threshold = ranked.gather(1, (k - 1).unsqueeze(1))  # [B, 1]
    return mask & (entropy >= threshold)  # [B, T]


def _select_in_block(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    threshold = _threshold_tensor(entropy, mask, rho)
    if threshold is None:
        return torch.zeros_like(mask)  # [B, T]
    return mask & (entropy >= threshold)  # [B, T]


def selection_key(entropy: Tensor, mode: str, generator: torch.Generator | None = None) -> Tensor:
    """What `high_entropy_mask` ranks by, for `loss.select`: `highest` the entropy itself
    (the paper), `lowest` its negation (the lowest-entropy share), `random` uniform keys
    from `generator` (a random share of the policy tokens; ablations)."""
    if mode == "highest":
        return entropy
    if mode == "lowest":
        return -entropy
    if mode == "random":
        return torch.rand(entropy.shape, generator=generator)
    raise ValueError(f"unknown selection {mode!r} (highest, lowest or random)")


def high_entropy_mask(
    entropy: Tensor,
    mask: Tensor,
    rho: float,
    scope: Scope = "batch",
    microbatch_size: int | None = None,
) -> Tensor:
    """Select the forking tokens: the top-ρ policy tokens by entropy within each scope.

    `entropy` [B, T] float, `mask` [B, T] bool (True = policy token; prompt, tool, env
    output and padding are False and can never be selected). Within each scope (`batch`:
    all rows; `microbatch`: consecutive blocks of `microbatch_size` rows; `sequence`:
    each row) with N masked tokens, k = ceil(ρ·N) and the threshold is the k-th largest
    masked entropy. Returns bool [B, T] = mask & (entropy >= threshold): ties at the
    threshold are all kept, so a scope may select more than k. ρ = 1 returns `mask`.
    For a batch split across workers, gather the entropies first: scope `batch` is the
    whole optimizer batch.
    """
    _check_mask_args(entropy, mask, rho)
    if entropy.dim() != 2:
        raise ValueError(f"entropy must be [B, T], got {tuple(entropy.shape)}")
    if scope not in ("batch", "microbatch", "sequence"):
        raise ValueError(f"unknown scope {scope!r}")
    if scope == "microbatch" and (microbatch_size is None or microbatch_size < 1):
        raise ValueError("scope 'microbatch' needs microbatch_size >= 1")
    mask = mask.bool()  # [B, T]
    if rho == 1.0 or mask.numel() == 0:
        return mask.clone()  # [B, T]
    if scope == "sequence":
        return _select_per_row(entropy, mask, rho)  # [B, T]
    if scope == "batch":
        return _select_in_block(entropy, mask, rho)  # [B, T]
    assert microbatch_size is not None
    blocks = [
        _select_in_block(entropy[i : i + microbatch_size], mask[i : i + microbatch_size], rho)
        for i in range(0, entropy.shape[0], microbatch_size)
    ]  # each [M, T]
    return torch.cat(blocks, dim=0)  # [B, T]


def loss_normaliser(selected: Tensor, policy_mask: Tensor, normaliser: Normaliser) -> float:
    """The token count to pass to `policy_loss(num_tokens=...)` for the whole batch.

    `selected` [B, T] bool is the forking-token selection, `policy_mask` [B, T] bool all
    policy tokens. `selected`: the loss is the mean over selected tokens (the paper's
    default). `all`: only selected tokens carry gradient but the sum is divided by the
    number of policy tokens, so the update shrinks with ρ as if the others had zero loss.
    Computed once over the full batch so that micro-batch losses sum to the batch mean.
    Clamped to >= 1 so an empty batch gives loss 0, not NaN.
    """
    if selected.shape != policy_mask.shape:
        raise ValueError("selected and policy_mask must have the same shape")
    if normaliser == "selected":
        count = int(selected.sum().item())
    elif normaliser == "all":
        count = int(policy_mask.sum().item())
    else:
        raise ValueError(f"unknown normaliser {normaliser!r}")
    return float(max(count, 1))


# --------------------------------------------------------------------- advantages


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    valid: Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages: reward minus its group's mean, optionally over the group's std.

    `rewards` [B] float, `group_ids` [B] integer ids (any values), `valid` [B] bool
    (False = failed rollout or grading; its reward may be NaN). Invalid samples get 0 and
    are left out of their group's mean and (population) std. A group with fewer than two
    valid members or all-equal valid rewards gives 0 to every member: it has no signal.
    Returns [B] in the rewards' dtype.
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError("rewards and group_ids must both be [B]")
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()  # [B]
    _, group = torch.unique(group_ids, return_inverse=True)  # [B]
    n_groups = int(group.max().item()) + 1 if group.numel() else 0
    r = torch.where(valid, rewards.double(), 0.0)  # [B]
    w = valid.double()  # [B]
    zeros = r.new_zeros(n_groups)  # [G]
    count = zeros.index_add(0, group, w)  # [G]
    mean = zeros.index_add(0, group, r) / count.clamp(min=1.0)  # [G]
    centred = (r - mean[group]) * w  # [B]
    std = (zeros.index_add(0, group, centred**2) / count.clamp(min=1.0)).sqrt()  # [G]
    # Exact zero-variance test (max == min), immune to rounding in mean/std.
    r_hi, r_lo = r.masked_fill(~valid, -math.inf), r.masked_fill(~valid, math.inf)  # [B]
    high = zeros.scatter_reduce(0, group, r_hi, "amax", include_self=False)  # [G]
    low = zeros.scatter_reduce(0, group, r_lo, "amin", include_self=False)  # [G]
    informative = (count >= 2) & (high > low)  # [G]
    adv = centred / (std[group] + eps) if scale_by_std else centred  # [B]
    keep = valid & informative[group]  # [B]
    return torch.where(keep, adv, 0.0).to(rewards.dtype)  # [B]


# ---------------------------------------------------------------------------- loss


def _check_loss_args(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
    num_tokens: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss with clip-higher, token-level mean, dual clip, k3 KL.

    `logprobs` [M, T] (with grad), `old_logprobs` [M, T] (behaviour policy), `advantages`
    [M] or [M, T], `loss_mask` [M, T] bool (tokens that carry gradient). Per token, with
    r = exp(logprobs - old_logprobs): loss = -min(r·A, clip(r, 1-eps_low, 1+eps_high)·A)
    (DAPO clip-higher); with `dual_clip` = c, tokens with A < 0 are capped at c·|A|
    (Ye et al. 2020, as in verl); with `ref_logprobs`, kl_coef · (e^d - d - 1), d = ref -
    logprobs (k3) is added. The masked sum is divided by `num_tokens` (pass the global
    count from `loss_normaliser` under gradient accumulation) or by the mask's count.
    `is_weights` [M, T] (no grad) scale each token's policy term: truncated importance
    sampling for a sampler whose numerics differ from the trainer's (Yao et al. 2025).
    Returns `(loss, metrics)`; metrics are floats over masked tokens.
    """
    _check_loss_args(eps_low, eps_high, dual_clip)
    if num_tokens is not None and num_tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    mask = loss_mask.bool()  # [M, T]
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [M, 1] or [M, T]
    # Zero every input off the mask first: a NaN/inf there (padding) would otherwise turn
    # into a NaN gradient even behind torch.where (0 * inf in the backward pass).
    adv = torch.where(mask, adv, 0.0)  # [M, T]
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0)  # [M, T]
    ratio = log_ratio.exp()  # [M, T]
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # [M, T]
    token_loss = torch.maximum(-ratio * adv, -clipped_ratio * adv)  # [M, T]
    if dual_clip is not None:
        capped = torch.minimum(token_loss, -dual_clip * adv)  # [M, T]
        token_loss = torch.where(adv < 0, capped, token_loss)  # [M, T]
    if is_weights is not None:
        token_loss = token_loss * torch.where(mask, is_weights.detach(), 0.0)  # [M, T]
    if ref_logprobs is not None:
        d = torch.where(mask, ref_logprobs - logprobs, 0.0)  # [M, T]
        kl = d.exp() - d - 1.0  # [M, T]
        token_loss = token_loss + kl_coef * kl  # [M, T]
    masked = torch.where(mask, token_loss, 0.0)  # [M, T]
    denom = num_tokens if num_tokens is not None else max(int(mask.sum().item()), 1)
    loss = masked.sum() / denom  # []
    metrics = _loss_metrics(ratio, log_ratio, adv, mask, eps_low, eps_high, dual_clip)
    if ref_logprobs is not None:
        metrics["kl"] = _masked_mean(kl.detach(), mask)
    return loss, metrics


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    count = int(mask.sum().item())
    return float(torch.where(mask, x, 0.0).sum().item()) / max(count, 1)


@torch.no_grad()
def _loss_metrics(
    ratio: Tensor,
    log_ratio: Tensor,
    adv: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> dict[str, float]:
    """Clip fractions count tokens whose gradient the clip zeroes: A>0 above, A<0 below.
    All of them reach the host in one transfer (on a GPU: one wait per call, not seven)."""
    high = (adv > 0) & (ratio > 1.0 + eps_high)  # [M, T]
    low = (adv < 0) & (ratio < 1.0 - eps_low)  # [M, T]
    terms = {
        "clip_frac": (high | low).float(),
        "clip_frac_low": low.float(),
        "clip_frac_high": high.float(),
        "ratio_mean": ratio,
        "approx_kl": 0.5 * log_ratio**2,
    }
    if dual_clip is not None:  # for A < 0 the unclipped loss -r·A exceeds c·|A| exactly when r > c
        terms["dual_clip_frac"] = ((adv < 0) & (ratio > dual_clip)).float()
    sums = [torch.where(mask, x, 0.0).sum().double() for x in terms.values()]  # fp32 -> fp64: exact
    *values, count = torch.stack([*sums, mask.sum().double()]).tolist()
    metrics = {name: v / max(int(count), 1) for name, v in zip(terms, values, strict=True)}
    return metrics | {"tokens": float(count)}
