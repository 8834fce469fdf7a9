"""LoRA adapters through `peft` (`model.lora`): wrap, reload from a checkpoint, merge.

With `model.lora` set, the trainer wraps its model in a `peft` model whose base weights
are frozen; only the adapters' A/B matrices train, so the optimizer holds their state
alone. `save_pretrained` of the wrapped model writes the adapter (`adapter_config.json`,
`adapter_model.safetensors`), which `PeftModel.from_pretrained(base, dir)` loads; the base
is named in the adapter config (`base_model_name_or_path`: the run's `model.name`, a
built-in name or a directory). Generation samples from the adapted policy after every
step: through the wrapped model itself or a lasting copy of it, or (the trainer's
transient copy in another dtype) through a plain model holding the merged weights
(`merged_copy`, `merged_parameters`), which decodes faster than one with the adapters
beside it. `merge_and_export` folds the adapters into the base weights and writes a plain
transformers model directory. `lora_section` reads a `peft.LoraConfig` (what a TRL user
passes as `peft_config`) as the `model.lora` section it stands for.

`peft` is an optional extra (`pip install 'rldojo[lora]'`); it is imported only here.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, cast

import torch
from pydantic import ValidationError

from rldojo.config import ConfigError, ConfigValueError, LoraSection
from rldojo.config.base import format_error

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel

    from rldojo.policy.base import Tokenizer

ADAPTER_CONFIG = "adapter_config.json"


def _peft() -> ModuleType:
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs peft: pip install 'rldojo[lora]'") from None
    return peft


def check_lora_available() -> None:
    """One-line error, before any model loads, when `model.lora` is set without peft."""
    _peft()


def is_adapter_dir(path: Path) -> bool:
    """Whether a checkpoint directory holds a LoRA adapter rather than full weights."""
    return (path / ADAPTER_CONFIG).exists()


def is_peft_model(model: object) -> TypeGuard[PeftModel]:
    """Whether `model` is wrapped in LoRA adapters (a `peft` model)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def add_lora(model: PreTrainedModel, lora: LoraSection, base_name: str) -> PeftModel:
    """Wrap `model` with fresh adapters (B = 0: the policy starts equal to the base)."""
    peft = _peft()
    _check_layers(lora.layers, model.config.num_hidden_layers, base_name)
    targets = (
        lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    )
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        bias="none",
        layers_to_transform=lora.layers,
    )
    wrapped: PeftModel = peft.get_peft_model(model, config)
    wrapped.peft_config["default"].base_model_name_or_path = base_name
    return wrapped


def _check_layers(layers: list[int] | None, count: int, base_name: str) -> None:
    """`model.lora.layers` against the model's layers; a `ConfigValueError` (not a
    `ConfigError`) so the command names the config file in front: the examples' layers
    20-29 are SmolLM2-135M's, and `--set model.name=tiny-random` (2 layers) meets them."""
    span = f"({count} layers: 0-{count - 1})"
    if layers == []:
        raise ConfigValueError(f"model.lora.layers: [] selects no layer of {base_name} {span}")
    outside = [i for i in layers or [] if not 0 <= i < count]
    if outside:
        raise ConfigValueError(
            f"model.lora.layers: layer {outside[0]} is out of range for {base_name} {span}"
        )


def load_adapter(base: torch.nn.Module, adapter_dir: Path, *, trainable: bool = True) -> PeftModel:
    """The base model with the adapter saved in `adapter_dir` (trainable to resume)."""
    peft = _peft()
    model: PeftModel = peft.PeftModel.from_pretrained(
        base, str(adapter_dir), is_trainable=trainable
    )
    return model


def load_merged(adapter_dir: Path) -> tuple[torch.nn.Module, Tokenizer]:
    """`(model, tokenizer)`: the adapter in `adapter_dir` loaded onto its base and merged
    into it, a plain model to sample from (`rldojo eval` of a LoRA checkpoint)."""
    from rldojo.policy.given_models import is_given
    from rldojo.policy.models import load_model

    name = adapter_base_name(adapter_dir)
    base, tokenizer = load_model(name)
    if is_given(name):  # a model object given to the run: it is left as it is
        base = copy.deepcopy(base)
    return merged(load_adapter(base, adapter_dir, trainable=False)), tokenizer


def adapter_base_name(adapter_dir: Path) -> str:
    """The base model an adapter was trained on (its `base_model_name_or_path`)."""
    import json

    name = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not name:
        raise ConfigError(f"{adapter_dir / ADAPTER_CONFIG}: base_model_name_or_path is empty")
    return str(name)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates (the adapters under LoRA; all otherwise)."""
    return [p for p in model.parameters() if p.requires_grad]


def merged(model: PeftModel) -> PreTrainedModel:
    """The plain transformers model under `model`, its adapters merged into its weights
    (peft's `merge_and_unload`: `model` gives up its base)."""
    plain: PreTrainedModel = model.merge_and_unload()
    return plain


def merged_copy(model: PeftModel) -> PreTrainedModel:
    """A plain transformers model (no adapter modules) shaped like `model` with its
    adapters merged; `model` is left as it is."""
    return merged(copy.deepcopy(model))


class _LoraLayer(Protocol):
    """What `merged_parameters` reads of a layer peft adapted (its `Linear`, `Embedding`...)."""

    lora_A: torch.nn.ModuleDict
    merged_adapters: list[str]

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def base_of(model: PeftModel) -> PreTrainedModel:
    """The transformers model under `model`'s adapters (peft types it as any module)."""
    return cast("PreTrainedModel", model.get_base_model())


def merged_parameters(model: PeftModel) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters of `merged_copy(model)`, by name, computed from the live `model`
    without changing it: an adapted layer's weight is its base weight plus peft's delta
    (B A scaled by alpha / r) of each active adapter not merged into it already; every
    other weight is the base's own tensor. Call under `torch.no_grad()`."""
    net = model.get_base_model()
    active = list(model.active_adapters)
    for name, param in net.named_parameters():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            yield name, param
            continue
        owner, leaf = name.rsplit(".base_layer.", 1)
        if leaf != "weight":
            yield f"{owner}.{leaf}", param
            continue
        layer = cast(_LoraLayer, net.get_submodule(owner))
        weight: torch.Tensor = param
        for adapter in active:
            if adapter in layer.lora_A and adapter not in layer.merged_adapters:
                weight = weight + layer.get_delta_weight(adapter)
        yield f"{owner}.weight", weight


def merge_and_export(model: torch.nn.Module, tokenizer: Tokenizer, out: Path) -> Path:
    """Fold the adapters into the base weights and write a plain HF model directory."""
    from transformers import PreTrainedModel

    plain = merged(model) if is_peft_model(model) else model
    if not isinstance(plain, PreTrainedModel):
        raise ConfigError(f"{type(plain).__name__}: not a transformers model, cannot export")
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def export_checkpoint(checkpoint: Path, out: Path, *, merge: bool) -> Path:
    """A checkpoint as a plain transformers model directory in `out`: an adapter
    checkpoint is loaded onto its base and merged (`merge` must be set), full weights are
    written as they are. Loads on the CPU, so it needs no GPU."""
    from rldojo.policy.models import load_model

    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty")
    if is_adapter_dir(checkpoint):
        if not merge:
            raise ConfigError(
                f"{checkpoint}: a LoRA adapter; pass --merge to fold it into "
                "its base (or load it with PeftModel.from_pretrained)"
            )
        model, tokenizer = load_merged(checkpoint)
    elif (checkpoint / "config.json").exists():
        model, tokenizer = load_model(str(checkpoint))
    else:
        raise ConfigError(f"{checkpoint}: not a checkpoint (no adapter_config.json or config.json)")
    return merge_and_export(model, tokenizer, out)


_LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "layers_to_transform")
"""The `peft.LoraConfig` fields that `model.lora` has a key for (`r`, `alpha`, `dropout`,
`target_modules`, `layers`)."""

_LORA_SET_BY_RLDOJO = ("peft_type", "task_type", "auto_mapping", "peft_version",
                       "base_model_name_or_path", "revision")  # fmt: skip
"""Fields that do not shape the adapters, or that rldojo sets itself (`task_type`: a
causal LM or None, checked apart)."""


def lora_section(config: LoraConfig) -> LoraSection:
    """The `model.lora` section of a `peft.LoraConfig`: `r`, `lora_alpha`, `lora_dropout`,
    `target_modules` (None: `model.lora`'s default) and `layers_to_transform`; any other
    field away from its default is a `ConfigValueError` naming it, never dropped."""
    peft = _peft()
    if not isinstance(config, peft.LoraConfig):
        raise ConfigValueError(
            f"peft_config: expected a peft.LoraConfig, got {type(config).__name__}"
        )
    if config.task_type not in (None, "CAUSAL_LM"):
        raise ConfigValueError(
            f"peft_config.task_type: {config.task_type!r}; rldojo trains "
            "causal language models (CAUSAL_LM)"
        )
    default = peft.LoraConfig()
    for field in dataclasses.fields(config):
        name = field.name
        if name in _LORA_KEYS or name in _LORA_SET_BY_RLDOJO:
            continue
        value = getattr(config, name)
        if value != getattr(default, name):
            raise ConfigValueError(
                f"peft_config.{name}: {value!r} has no model.lora key in "
                f"rldojo; leave it at {getattr(default, name)!r}"
            )
    section: dict[str, Any] = {
        "r": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
    }
    targets = config.target_modules
    if isinstance(targets, str) and targets != "all-linear":
        raise ConfigValueError(
            f"peft_config.target_modules: {targets!r} (a regular "
            "expression); give module names or 'all-linear'"
        )
    if targets is not None:
        section["target_modules"] = targets if isinstance(targets, str) else sorted(targets)
    layers = config.layers_to_transform
    if layers is not None:
        section["layers"] = [layers] if isinstance(layers, int) else list(layers)
    try:
        return LoraSection.model_validate(section)
    except ValidationError as exc:  # e.g. a dropout of 1 or more
        raise ConfigValueError(
            format_error("peft_config (as model.lora)", exc, LoraSection)
        ) from None
