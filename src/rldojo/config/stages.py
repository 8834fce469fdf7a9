"""Shared keys set for one objective alone: `[sft.optim]`, `[distill.run]`, ...

Every command reads the same sections: `[model]`, `[optim]`, `[eval]` and `[run]` hold one
value per key, whatever trains. A file that holds several stages (demonstrations, SFT and
RL, as `rldojo pipeline` and the agentic examples run them) sets a key for one objective
alone in a table of that objective's section, in the same words:

    [optim]
    lr = 2e-4            # rldojo train
    [sft.optim]
    lr = 5e-5            # rldojo sft
    [sft.model]
    lora = "none"        # SFT trains every weight; RL trains the adapters of [model]

`for_objective(config, "sft")` is the config as `rldojo sft` runs it: first the
objective's own defaults for shared keys the config leaves unset (`OBJECTIVE_DEFAULTS`),
then its tables over the shared sections. The run's config.toml records the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from rldojo.config import TrainConfig

STAGE_SECTIONS = ("model", "optim", "eval", "run")
"""The shared sections an objective's section may hold a table of."""

OBJECTIVE_DEFAULTS: dict[str, dict[str, Any]] = {
    "sft": {"optim.lr": 5e-5, "optim.warmup_steps": 2},
}
"""Values of shared keys an objective takes where the config sets none: SFT's learning
rate and warmup (a supervised loss takes a larger step than a policy gradient's)."""

MOVED = {
    "sft.lr": "optim.lr (for SFT alone: [sft.optim] lr)",
    "sft.warmup_steps": "optim.warmup_steps (for SFT alone: [sft.optim] warmup_steps)",
    "sft.epochs": "run.epochs (for SFT alone: [sft.run] epochs)",
    "sft.lora": 'model.lora (SFT without adapters: [sft.model] lora = "none")',
    "sft.eval_before": "eval.before (for SFT alone: [sft.eval] before)",
}
"""Keys that moved to a shared section: the one-line error names the new place."""


def stage_field(section: str, objective: str) -> Any:
    """The field of an objective's table of `section` (None: not given)."""
    return Field(
        None,
        json_schema_extra={"stage": True},
        description=f"keys of [{section}] for `rldojo {objective}` alone",
    )


def is_stage(model: type[BaseModel], name: str) -> bool:
    """Whether `model.name` is an objective's table of a shared section (only its given
    keys count, and a config.toml writes only those)."""
    extra = model.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("stage"))


def given(section: BaseModel | None) -> dict[str, Any]:
    """The keys a table sets: the ones given, not its defaults."""
    if section is None:
        return {}
    return {k: getattr(section, k) for k in section.model_fields_set}


def for_objective(config: TrainConfig, objective: str) -> TrainConfig:
    """`config` as `objective` ("sft", "distill") runs it: `OBJECTIVE_DEFAULTS` where the
    shared sections leave a key unset, then the objective's tables over them."""
    own = getattr(config, objective)
    update: dict[str, BaseModel] = {}
    for name in STAGE_SECTIONS:
        shared: BaseModel = getattr(config, name)
        values = {
            dotted.split(".")[1]: value
            for dotted, value in OBJECTIVE_DEFAULTS.get(objective, {}).items()
            if dotted.split(".")[0] == name and dotted.split(".")[1] not in shared.model_fields_set
        }
        values |= given(getattr(own, name))
        if values:
            update[name] = shared.model_copy(update=values)
    return config.model_copy(update=update)
