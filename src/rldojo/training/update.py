"""The policy update: mini-batches of micro-batched clipped loss, one AdamW step each.

`Trainer.train_on` decides what to train on (advantages, the forking-token mask);
`PolicyUpdate.optimize` does the arithmetic on the model. The rollout batch is split
into `optim.mini_batches` mini-batches, passed over `optim.epochs` times; each
mini-batch is one optimizer step: per micro-batch a forward pass (the group's shared
prompt once, see `train.batch`), the loss of `train.losses`, backward; then clipping and
AdamW. The PPO ratio is taken against the log-probs before the batch's first step
(`pi_old`: a no-grad forward when there is more than one step, else the current ones,
ratio 1), or against the sampler's for rows sampled by other weights (stale); fresh rows
get a truncated IS weight min(pi_old / pi_sampler, cap) for the sampler's numeric
mismatch. Each mini-batch is normalised by its own token count (`loss.normaliser`).

Devices: the rollout batch, advantages and mask stay on the host; each micro-batch is
moved to the model's device after slicing, so the loop's bookkeeping never waits on a
GPU. Autocast follows the device (bf16 on CUDA when `model.autocast_bf16` resolves so).
With `optim.activation_checkpointing` the gradient forward runs each decoder layer
checkpointed (`train.activations`), the prompt sharing kept.
The update's own metrics stay tensors until the optimizer step and reach the host in
one transfer per step (the loss function's clip statistics still read per micro-batch).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from typing import Any

import torch

from rldojo.config import OptimConfig, TrainConfig
from rldojo.policy.device import autocast_device_type, model_device
from rldojo.training import losses
from rldojo.training.activations import checkpointed_layers
from rldojo.training.batch import (
    TokenBatch,
    completion_logits,
    selected_logits,
    splits_output_layer,
)
from rldojo.training.distributed import Dist, is_sharded, rank_micro_batches
from rldojo.types import Score


@functools.cache
def _malloc_trim() -> Any:
    """glibc's `malloc_trim`, looked up once (None: not glibc)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Return freed heap pages to the OS (glibc keeps them, so RSS creeps step to step).
    Called after each micro-batch, so the library is looked up once, not per call."""
    trim = _malloc_trim()
    if trim is not None:  # not glibc: nothing to do
        trim(0)


def lr_lambda(step: int, warmup: int, total: int, schedule: str) -> float:
    """LR multiplier: linear warmup, then constant / linear decay / cosine decay to 0."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw_with_schedule(
    params: Any, optim: OptimConfig, *, lr: float, warmup: int, total: int
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over `params` (`optim`'s betas and weight decay; fused: one kernel per step
    instead of foreach's full-size temporaries, for the peak memory) and its learning-rate
    schedule: `lr_lambda` with `warmup` steps over `total`, `optim.schedule`. The one
    optimizer of every objective (GRPO, SFT, distillation)."""
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: lr_lambda(k, warmup, total, optim.schedule)
    )
    return optimizer, scheduler


def clipped_step(
    optimizer: torch.optim.Optimizer, params: Any, max_norm: float
) -> tuple[torch.Tensor, bool]:
    """Clip the gradient to `max_norm` and take the optimizer step, unless its norm is not
    finite: a NaN or inf gradient (a kernel's NaN, an overflow) would make every weight
    NaN for good, so that step is skipped and the weights and the optimizer's state stay
    as they were. Returns (the norm before clipping, whether the step was taken)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    full = getattr(norm, "full_tensor", None)  # sharded gradients (FSDP2): a DTensor norm
    norm = full() if full is not None else norm
    finite = bool(torch.isfinite(norm))
    if finite:
        optimizer.step()
    return norm, finite


def token_advantages(advantages: torch.Tensor, scores: Sequence[Score], t: int) -> torch.Tensor:
    """Sequence advantages [B] broadcast to tokens [B, T], plus any per-token rewards."""
    out = advantages[:, None].expand(-1, t).clone()  # [B, T]
    for row, score in enumerate(scores):
        if score.token_rewards:
            extra = torch.tensor(score.token_rewards[:t], dtype=out.dtype)  # [T']
            out[row, : extra.shape[0]] += extra
    return out


def autocast_context(config: TrainConfig, device: torch.device) -> Any:
    """bf16 autocast on `device` when `model.autocast_bf16` resolved to true, else none:
    the precision of every training forward (the policy update and SFT)."""
    if config.model.autocast_bf16 is True:  # resolved from "auto" by resolve_resources
        # Autocast caches each weight's bf16 cast until the context closes (a second copy
        # of the weights). Under activation checkpointing the layers' casts would not be
        # kept for the backward pass anyway, so the cache only adds to the peak: skip it.
        cache = not config.optim.activation_checkpointing
        return torch.autocast(
            autocast_device_type(device), dtype=torch.bfloat16, cache_enabled=cache
        )
    return nullcontext()


def forward_context(config: TrainConfig, model: Any, device: torch.device) -> ExitStack:
    """The context of one training forward of `model`: `autocast_context`, and each
    decoder layer checkpointed when `optim.activation_checkpointing` is on and gradients
    are enabled (a no-grad forward keeps nothing to recompute)."""
    stack = ExitStack()
    stack.enter_context(autocast_context(config, device))
    recompute = config.optim.activation_checkpointing and torch.is_grad_enabled()
    stack.enter_context(checkpointed_layers(model, recompute))
    return stack


class PolicyUpdate:
    """Owns nothing but references: the trained model, the KL reference, the optimizer."""

    def __init__(
        self,
        model: Any,
        ref_model: Any,
        optimizer: torch.optim.Optimizer,
        config: TrainConfig,
        dist: Dist | None = None,
    ) -> None:
        self.model, self.ref_model = model, ref_model
        self.optimizer, self.config = optimizer, config
        self.dist = dist or Dist()
        self.device = self.dist.device if self.dist.sharded else model_device(model)

    def _autocast(self) -> Any:
        return autocast_context(self.config, self.device)

    def optimize(
        self, batch: TokenBatch, advantages: torch.Tensor, selected: torch.Tensor, version: int
    ) -> dict[str, Any]:
        """`epochs` x `mini_batches` optimizer steps on the batch; metrics are the steps'
        means (`optim/steps` counts them, `optim/grad_norm_max` is the largest norm,
        `optim/nonfinite_skipped` counts those skipped for a NaN or inf gradient).
        On several ranks each mini-batch's rows are dealt round the ranks (`_plan`); its
        normaliser is still the whole mini-batch's, so the ranks' gradients add up to it."""
        oc = self.config.optim
        several = oc.mini_batches > 1 or oc.epochs > 1
        size = math.ceil(batch.size / oc.mini_batches)
        minis = [list(range(s, min(s + size, batch.size))) for s in range(0, batch.size, size)]
        plans = [self._plan(rows) for rows in minis]
        old = self._old_logprobs(batch, selected, plans) if several else None  # [B, T] or None
        steps = []
        for _ in range(oc.epochs):
            for rows, plan in zip(minis, plans, strict=True):
                num_tokens = losses.loss_normaliser(
                    selected[rows], batch.policy_mask[rows], self.config.loss.normaliser
                )
                steps.append(
                    self._step(batch, advantages, selected, num_tokens, version, old, plan)
                )
        out = {key: sum(s[key] for s in steps) / len(steps) for key in steps[0]}
        out["optim/grad_norm_max"] = max(s["optim/grad_norm"] for s in steps)
        # optimizer steps skipped for a NaN or inf gradient (a count, not a mean)
        out["optim/nonfinite_skipped"] = sum(s["optim/nonfinite_skipped"] for s in steps)
        out["optim/steps"] = len(steps)
        return out

    def _plan(self, rows: list[int]) -> tuple[list[list[int]], int]:
        """This rank's micro-batches of a mini-batch's `rows` and how many of them are
        padding (`rank_micro_batches`): consecutive rows on one rank."""
        size = self.config.optim.micro_batch_size
        micro = [rows[k : k + size] for k in range(0, len(rows), size)]
        return rank_micro_batches(micro, self.dist, size)

    @torch.no_grad()
    def _old_logprobs(
        self,
        batch: TokenBatch,
        selected: torch.Tensor,
        plans: Sequence[tuple[list[list[int]], int]],
    ) -> torch.Tensor:
        """`pi_old`: the log-probs `[B, T]` before any step, where the loss will read them
        (this rank's rows; the others stay 0)."""
        temperature = self.config.sampling.temperature or 1.0
        out = torch.zeros(batch.completion_ids.shape, device=self.device)  # [B, T]
        for micro, padding in plans:
            for rows in micro[: len(micro) - padding]:
                mb = batch.rows(rows).to(self.device)
                where = selected[rows][:, : mb.completion_ids.shape[1]].to(self.device)
                lp = self._logprobs(
                    self.model, mb, temperature, where if self._split(self.model) else None
                )
                out[rows, : lp.shape[1]] = lp.to(out.dtype)
            for rows in micro[len(micro) - padding :]:  # a collective the others take part in
                self._logprobs(self.model, batch.rows(rows).to(self.device), temperature, None)
        return out

    def _step(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        selected: torch.Tensor,
        num_tokens: float,
        version: int,
        old: torch.Tensor | None,
        plan: tuple[list[list[int]], int],
    ) -> dict[str, float]:
        """Accumulate the loss over this rank's micro-batches of one mini-batch (`plan`),
        clip, and take one AdamW step; the metrics' sums are the ranks' together."""
        micro, padding = plan
        weights = [1.0] * (len(micro) - padding) + [0.0] * padding
        self.optimizer.zero_grad(set_to_none=True)
        results = []
        for rows, weight in zip(micro, weights, strict=True):
            results.append(
                self._microbatch_backward(
                    batch.rows(rows),
                    advantages[rows],
                    selected[rows],
                    num_tokens,
                    version,
                    None if old is None else old[rows],
                    weight,
                )
            )
            release_freed_memory()  # the micro-batch's activations, before the next one
        host = _to_host(results)
        sums = dict.fromkeys(host[0], 0.0)  # every micro-batch has the same keys
        unweighted = ("tokens", "loss", "mismatch", "tis", "measured")
        for m, weight in zip(host, weights, strict=True):
            if not weight:  # padding: it kept the ranks' forward passes in step
                continue
            for key, value in m.items():
                sums[key] += value if key in unweighted else value * m.get("tokens", 0.0)
        sums = self.dist.sum_all(sums)
        cfg = self.config
        grad_norm, stepped = clipped_step(
            self.optimizer, self.model.parameters(), cfg.optim.grad_clip
        )
        self.optimizer.zero_grad(set_to_none=True)  # free the gradients before generating
        release_freed_memory()
        tokens = max(sums.pop("tokens", 0.0), 1.0)
        measured = max(sums.pop("measured", 0.0), 1.0)  # tokens whose log-prob was computed
        out = {"loss/policy": sums.pop("loss"), "loss/tokens": tokens}
        out["policy/logprob_mismatch"] = sums.pop("mismatch") / measured
        tis = sums.pop("tis")
        if cfg.loss.tis_cap is not None:
            out["policy/tis_weight_mean"] = tis / measured
        out |= {f"loss/{k}": v / tokens for k, v in sums.items()}
        out["optim/grad_norm"] = float(grad_norm)
        out["optim/nonfinite_skipped"] = 0.0 if stepped else 1.0
        return out

    def _microbatch_backward(
        self,
        mb: TokenBatch,
        advantages: torch.Tensor,
        selected: torch.Tensor,
        num_tokens: float,
        version: int,
        old_logprobs: torch.Tensor | None = None,
        weight: float = 1.0,
    ) -> dict[str, Any]:
        """Forward, clipped loss and backward for one micro-batch; returns its metrics
        (floats, and 0-dim tensors still on the device: `_to_host`).
        `old_logprobs` `[M, T]` is `pi_old` (None: the current log-probs, ratio 1).
        `weight` 0: a padding micro-batch (`rank_micro_batches`), no gradient. On several
        ranks the loss is scaled by the world size: the sharded model averages the ranks'
        gradients, and each rank's loss is its part of the mini-batch's sum."""
        cfg, lc = self.config, self.config.loss
        mb, advantages, selected = (
            mb.to(self.device),
            advantages.to(self.device),
            selected.to(self.device),
        )
        temperature = cfg.sampling.temperature or 1.0
        t = mb.completion_ids.shape[1]
        where = selected[:, :t] if self._split(self.model) else None  # [M, T] or None
        logprobs = self._logprobs(self.model, mb, temperature, where)  # [M, T]
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref_where = where if self._split(self.ref_model) else None
                ref = self._logprobs(self.ref_model, mb, temperature, ref_where)  # [M, T]
        behaviour = mb.behaviour_logprobs  # [M, T]
        pre = logprobs.detach() if old_logprobs is None else old_logprobs[:, :t]  # [M, T]
        old, is_weights = self._ratio_base(mb, pre, version)
        loss, m = losses.policy_loss(
            logprobs,
            old,
            advantages[:, :t],
            selected[:, :t],
            eps_low=lc.eps_low,
            eps_high=lc.eps_high,
            dual_clip=lc.dual_clip,
            num_tokens=num_tokens,
            ref_logprobs=ref,
            kl_coef=lc.kl_coef,
            is_weights=is_weights,
        )
        scale = weight * self.dist.world
        (loss if scale == 1.0 else loss * scale).backward()
        policy = mb.policy_mask if where is None else where  # [M, T] tokens with a log-prob
        out: dict[str, Any] = dict(m)  # floats, and 0-dim device tensors read later
        out["loss"] = loss.detach()
        out["measured"] = policy.sum()
        out["mismatch"] = torch.where(policy, (pre - behaviour).abs(), 0.0).sum()
        tis = torch.where(policy, is_weights, 0.0).sum() if is_weights is not None else 0.0
        out["tis"] = tis
        return out

    def _ratio_base(
        self, mb: TokenBatch, pre: torch.Tensor, version: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What each row's PPO ratio is taken against, and its truncated IS weights.
        Stale rows (sampled by other weights: older ones, or ones a crash lost) take their
        behaviour log-probs; on-policy rows `pre`, pi_old (the weights before this batch's
        first step), with a truncated IS weight for the sampler's numeric mismatch (bf16
        sampler, fp32 trainer; `loss.tis_cap`). Returns `(old [M, T], weights [M, T] or
        None)`."""
        behaviour = mb.behaviour_logprobs  # [M, T]
        zeros = torch.zeros(mb.size, device=self.device)
        versions = mb.versions if mb.versions is not None else zeros  # [M]
        stale = (versions != version)[:, None]  # [M, 1] (newer: from lost weights)
        old = torch.where(stale, behaviour, pre)  # [M, T]
        cap = self.config.loss.tis_cap
        if cap is None:
            return old, None
        ratio = (pre - behaviour).exp().clamp(max=cap)  # [M, T]
        return old, torch.where(stale, torch.ones_like(ratio), ratio)  # [M, T]

    @torch.no_grad()
    def entropy(self, batch: TokenBatch) -> torch.Tensor:
        """Entropy of the current policy at the sampling temperature (the `trainer` source),
        `[B, T]` on the host; on several ranks each computes its rows and they are summed."""
        temperature = self.config.sampling.temperature or 1.0
        out = torch.zeros(batch.completion_ids.shape)  # [B, T], on the host with the mask code
        micro, padding = self._plan(list(range(batch.size)))
        for k, rows in enumerate(micro):
            mb = batch.rows(rows).to(self.device)
            with self._autocast():
                logits = completion_logits(self.model, mb)  # [M, T', V]
            if k < len(micro) - padding:  # else a collective the others take part in
                _, ent = losses.logprobs_and_entropy(logits, mb.completion_ids, temperature)
                out[rows, : ent.shape[1]] = ent.float().cpu()  # [M, T']
        return self.dist.sum_tensor(out)

    def _split(self, model: Any) -> bool:
        """Whether the output layer runs on the loss's positions alone (not under FSDP:
        its root unit gathers the output layer only in the model's own forward)."""
        return (
            self.config.optim.selected_logits
            and splits_output_layer(model)
            and not is_sharded(model)
        )

    def _logprobs(
        self, model: Any, mb: TokenBatch, temperature: float, where: torch.Tensor | None
    ) -> torch.Tensor:
        """Log-probs `[M, T]` of the completion tokens; with `where` `[M, T]` only there
        (the output layer and log-softmax run on those positions alone; the rest are 0)."""
        # Not under FSDP: the shared prompt's two forward passes bypass its root unit.
        share = self.config.optim.share_prompt and not is_sharded(model)
        if where is None:
            with forward_context(self.config, model, self.device):
                logits = completion_logits(model, mb, share_prefix=share)  # [M, T, V]
            return losses.logprobs_and_entropy(logits, mb.completion_ids, temperature)[0]
        with forward_context(self.config, model, self.device):
            logits = selected_logits(model, mb, where, share_prefix=share)  # [N, V]
        ids = mb.completion_ids[where]  # [N]
        picked, _ = losses.logprobs_and_entropy(logits[None], ids[None], temperature)  # [1, N]
        out = torch.zeros(where.shape, dtype=picked.dtype, device=where.device)  # [M, T]
        return out.masked_scatter(where, picked[0])


def _to_host(results: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Micro-batch metrics with their device tensors read in one transfer (one sync)."""
    keys = [(i, k) for i, m in enumerate(results) for k, v in m.items() if torch.is_tensor(v)]
    values = torch.stack([results[i][k].float() for i, k in keys]).tolist() if keys else []
    out = [dict(m) for m in results]
    for (i, k), v in zip(keys, values, strict=True):
        out[i][k] = v
    return out
