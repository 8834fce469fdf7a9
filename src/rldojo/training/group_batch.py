"""From a step's groups to what the policy update trains on (`Trainer.train_on`).

    groups -> valid samples -> group advantages -> token batch
           -> token entropies (the sampler's, or the trainer's: `loss.entropy_source`)
           -> the top-ρ forking-token mask (`loss.rho`, `loss.scope`, `loss.select`)

The mask is taken once per rollout batch over the whole batch, whatever the number of
optimizer steps or ranks: sharded, every rank builds the same `GroupBatch` from the same
groups (the trainer's entropies are each rank's rows, summed), so every rank selects the
positions one process selects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rldojo.config import TrainConfig
from rldojo.rollout.groups import Group
from rldojo.training import losses
from rldojo.training.batch import TokenBatch, build_token_batch
from rldojo.training.step_metrics import entropy_stats, forking_tokens, mask_threshold
from rldojo.types import Score

__all__ = ["GroupBatch", "group_batch"]


@dataclass
class GroupBatch:
    """The valid samples of a step's groups, in group order, ready for the update."""

    batch: TokenBatch
    scores: list[Score]
    advantages: torch.Tensor  # [B] per sample, normalised within its group
    entropy: torch.Tensor  # [B, T] what chose the mask
    selected: torch.Tensor  # [B, T] bool: the forking tokens that carry gradient
    ledger_ids: list[int]

    def selection(self) -> dict[int, tuple[float, list[int]]]:
        """For the ledger: each sample's advantage and selected positions, by ledger id."""
        adv, sel = self.advantages.tolist(), self.selected.cpu()  # one copy, not a sync a row
        # (the mask is within the policy tokens: nothing past a completion is selected)
        return {i: (adv[b], sel[b].nonzero()[:, 0].tolist()) for b, i in enumerate(self.ledger_ids)}

    def metrics(self, config: TrainConfig, tokenizer: Any) -> dict[str, Any]:
        """The mask's metrics: entropy quantiles, threshold, counts, the forking tokens."""
        lc, policy = config.loss, self.batch.policy_mask
        out: dict[str, Any] = {
            f"entropy/{k}": v for k, v in entropy_stats(self.entropy, policy).items()
        }
        out["entropy/threshold"] = mask_threshold(
            self.entropy, self.selected, lc.scope, config.optim.micro_batch_size
        )
        out["entropy/tokens_selected"] = int(self.selected.sum())
        out["entropy/tokens_policy"] = int(policy.sum())
        out["entropy/source"] = lc.entropy_source  # whose entropies chose the mask
        out["entropy/forking_tokens"] = forking_tokens(
            tokenizer, self.batch.completion_ids, self.selected
        )
        out["train/sequences"] = self.batch.size
        return out


def group_batch(
    groups: Sequence[Group],
    config: TrainConfig,
    pad_id: int,
    trainer_entropy: Callable[[TokenBatch], torch.Tensor],
    step: int,
) -> GroupBatch:
    """The `GroupBatch` of `groups` at optimizer step `step` (it seeds a random `select`).
    `trainer_entropy`: the current policy's entropies of a batch, when
    `loss.entropy_source = "trainer"`."""
    lc = config.loss
    keep = [(g, k) for g in groups for k, ok in enumerate(g.valid) if ok]
    rollouts = [g.rollouts[k] for g, k in keep]
    scores = [g.scores[k] for g, k in keep]
    group_ids = [i for i, g in enumerate(groups) for ok in g.valid if ok]
    advantages = losses.group_advantages(
        torch.tensor([s.value for s in scores]),
        torch.tensor(group_ids),
        scale_by_std=lc.scale_adv_by_std,
    )  # [B] fmt: skip
    batch = build_token_batch(rollouts, pad_id, group_ids)
    entropy = batch.sampler_entropy if lc.entropy_source == "sampler" else trainer_entropy(batch)
    rng = torch.Generator().manual_seed(config.run.seed * 1_000_003 + step)
    selected = losses.high_entropy_mask(
        losses.selection_key(entropy, lc.select, rng),
        batch.policy_mask,
        lc.rho,
        lc.scope,
        config.optim.micro_batch_size,
    )  # [B, T] fmt: skip
    return GroupBatch(
        batch, scores, advantages, entropy, selected, [g.ledger_ids[k] for g, k in keep]
    )
