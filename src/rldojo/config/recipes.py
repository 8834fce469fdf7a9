"""Recipes: named sets of defaults for the training algorithm, chosen by one top-level key.

`recipe = "dapo"` at the top of a config (or `--set recipe=dapo`) fills in the recipe's
values under the keys the config sets itself: a key the config gives wins, then the
recipe's value, then the field's default. The name stays in the config
(`TrainConfig.recipe`), so the `config.toml` of a run records it beside the values it
resolved to, and `rldojo train --dry-run` lists them (`describe_recipe`).

A recipe sets only keys that exist; what a paper does that rldojo has no key for is named
in the recipe's docstring as not reproduced. `clip_note` says when the PPO clips
(`loss.eps_low`, `loss.eps_high`, `loss.dual_clip`) cannot act for a config at all.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from rldojo.config import TrainConfig

RecipeName = Literal["grpo", "dapo", "dr_grpo", "paper"]
"""The recipes a config can name."""

GRPO: dict[str, Any] = {}
"""The field defaults, unchanged; naming it records that choice in the run's config. The
defaults are this library's forking-token GRPO, not DeepSeekMath's: the top 20% of tokens
by entropy carry gradient (`loss.rho = 0.2`, "Beyond the 80/20 Rule"), with DAPO's
clip-higher bounds, token-level loss and dynamic sampling, no KL term, and one optimizer
step per rollout batch (so the clips do not act: `clip_note`)."""

DAPO: dict[str, Any] = {
    "loss.rho": 1.0,
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.28,
    "loss.normaliser": "selected",
    "loss.kl_coef": 0.0,
    "loss.scale_adv_by_std": True,
    "rollout.dynamic_sampling": True,
    "optim.mini_batches": 4,
    "optim.epochs": 1,
}
"""DAPO ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", Yu et al.
2025). Every token carries gradient (`loss.rho = 1.0`: DAPO selects no tokens).
Clip-Higher: eps_low 0.2, eps_high 0.28. Token-level policy-gradient loss: the mean over
every token of the mini-batch (`loss.normaliser = "selected"` with rho 1). No KL penalty.
Group advantages normalised by the group's mean and std, as GRPO's. Dynamic sampling:
groups whose rewards do not vary are replaced by new draws (`rollout.dynamic_sampling`;
how many extra draws is `rollout.max_extra_rounds`). Several updates per rollout batch:
DAPO takes 16 gradient updates per rollout step (512 prompts x 16 responses, mini-batches
of 512 responses, one pass); 4 mini-batches of 2 prompts at the default 8 prompts x 8
samples keep several updates with whole groups, which is what lets clip-higher act.
Not reproduced (no key): Overlong Reward Shaping and the filtering of truncated samples;
its scale (learning rate 1e-6, 20k-token generations) is left to the config."""

DR_GRPO: dict[str, Any] = {
    "loss.rho": 1.0,
    "loss.scale_adv_by_std": False,
    "loss.eps_low": 0.2,
    "loss.eps_high": 0.2,
    "rollout.dynamic_sampling": False,
}
"""Dr. GRPO ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et al.
2025). Advantages are the reward minus the group's mean, not divided by the group's std
(`loss.scale_adv_by_std = false`). Every token carries gradient (`loss.rho = 1.0`). The
PPO clip is symmetric, 1 - eps to 1 + eps (eps_low = eps_high = 0.2). Each step trains
the batch it drew (`rollout.dynamic_sampling = false`: no refills, which are DAPO's).
Dr. GRPO also replaces GRPO's division of each response's loss by its length with a
constant; rldojo never divides by a response's length (`loss.normaliser` divides a
mini-batch's summed loss by its token count), so that bias is absent, and a constant
divisor has no key: `loss.normaliser` keeps its default."""

PAPER: dict[str, Any] = {
    **DAPO,
    "loss.rho": 0.2,
    "loss.select": "highest",
    "loss.scope": "batch",
    "loss.entropy_source": "sampler",
    "sampling.temperature": 1.0,
}
"""The 80/20 paper ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", Wang et al. 2025, arXiv 2506.01939): DAPO
(above, 4 mini-batches per batch for the paper's 16 updates per rollout step) where only
the top 20% of tokens by entropy over the whole batch carry gradient (`loss.rho = 0.2`,
`select = "highest"`, `scope = "batch"`), ranked by the entropies recorded while
sampling. Sampled at temperature 1.0, the policy's own distribution, whose entropies the
rule ranks. Not reproduced: the paper's overlong reward shaping and its models."""

RECIPES: dict[str, dict[str, Any]] = {
    "grpo": GRPO,
    "dapo": DAPO,
    "dr_grpo": DR_GRPO,
    "paper": PAPER,
}
"""Each recipe's values by dotted key (`section.key`), in `RecipeName`'s order."""


def apply_recipe(data: object) -> object:
    """The input of a `TrainConfig` with its recipe's values filled in where it sets no
    value itself. An input without a known recipe is returned as it is (an unknown name
    is then rejected by the `recipe` field, naming the valid ones)."""
    if not isinstance(data, dict):
        return data
    name = data.get("recipe")
    values = RECIPES.get(name) if isinstance(name, str) else None
    if not values:
        return data
    out = dict(data)
    for dotted, value in values.items():
        section, key = dotted.split(".")
        given = out.get(section, {})
        if isinstance(given, BaseModel):  # a section built in code: what it was given
            given = {k: getattr(given, k) for k in given.model_fields_set}
        if isinstance(given, dict) and key not in given:
            out[section] = {**given, key: value}
    return out


def describe_recipe(config: TrainConfig) -> list[str]:
    """One line per value of the config's recipe, e.g. `recipe dapo: loss.eps_high=0.28`;
    a key the config sets otherwise says so: `recipe dapo: loss.rho=1.0 (explicit:
    loss.rho=0.5)`. No recipe: no lines."""
    if config.recipe is None:
        return []
    values = RECIPES[config.recipe]
    if not values:
        return [f"recipe {config.recipe}: the field defaults (it sets no key)"]
    lines = []
    for dotted, preset in values.items():
        section, key = dotted.split(".")
        actual = getattr(getattr(config, section), key)
        line = f"recipe {config.recipe}: {dotted}={json.dumps(preset)}"
        if actual != preset:
            line += f" (explicit: {dotted}={json.dumps(actual)})"
        lines.append(line)
    return lines


def clip_note(config: TrainConfig) -> str | None:
    """One line when the clipped ratio cannot act in this config, else None.

    The PPO ratio of a token is its log-prob now against the one it is compared with
    (`rldojo.training.update`): for a row sampled by the current weights, `pi_old`, the
    log-prob before the batch's first optimizer step; for a stale row (generated ahead
    with `rollout.max_policy_lag >= 1`), the sampler's log-prob. With one optimizer step
    per batch (`optim.mini_batches = optim.epochs = 1`) and no generation ahead, `pi_old`
    is the current log-prob itself and the ratio is exactly 1 at the only step, so
    neither clip bound nor the dual clip can act. A sampler whose numerics differ from
    the trainer's (bf16, vLLM) does not change that: its mismatch is the truncated IS
    weight (`loss.tis_cap`), not the ratio."""
    several = config.optim.mini_batches > 1 or config.optim.epochs > 1
    if several or config.rollout.max_policy_lag >= 1:
        return None
    lc = config.loss
    clips = f"loss.eps_low={lc.eps_low:g}, loss.eps_high={lc.eps_high:g}"
    if lc.dual_clip is not None:
        clips += f", loss.dual_clip={lc.dual_clip:g}"
    return (
        f"clip: {clips} cannot act: one optimizer step per rollout batch on samples of the "
        "current weights keeps the PPO ratio at exactly 1 (optim.mini_batches = "
        "optim.epochs = 1, rollout.max_policy_lag = 0); optim.mini_batches > 1 lets them act"
    )
