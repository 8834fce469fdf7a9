"""The `model=`, `tokenizer=` and `peft_config=` arguments of `rldojo.train` and `rldojo.sft`.

A TRL user writes `GRPOTrainer(model=..., processing_class=tokenizer, peft_config=...)`;
rldojo's calls take the same three and turn them into config:

- `model`: a name (as `model.name`) or a `transformers.PreTrainedModel`. An object is
  registered in this process (`rldojo.policy.given_models`) and the config names it by its
  id (`object:NAME.DIGEST`, in `RUN/config.toml`). The run trains the object itself, in
  place, as TRL does: it is moved to the run's device, its attention switched to rldojo's
  padding-safe SDPA, and under LoRA peft injects the adapters into it; after the run it
  holds the trained weights (a KL reference is a copy).
- `tokenizer`: a `PreTrainedTokenizerBase` for a model object (default: loaded from the
  object's `name_or_path`); set to left padding, with a padding token, in place.
- `peft_config`: a `peft.LoraConfig`, read as the `model.lora` section
  (`rldojo.policy.lora.lora_section`: a field with no key there is an error, not dropped).

The object lives in this process, so a run that would need it in another is refused in
one line: several training ranks (`run.train_ranks`, torchrun), Ray rollout workers, vLLM.
A resume in a new process works when the same model is passed again (the id is a digest
of its class, `name_or_path` and config); without it, the run's model name is a one-line
error saying to pass it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rldojo.config import ConfigValueError, TrainConfig

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rldojo.policy.base import Tokenizer

__all__ = ["with_model"]


def with_model(
    config: TrainConfig,
    model: str | PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase | None,
    peft_config: LoraConfig | None,
) -> TrainConfig:
    """`config` with `model.name` replaced by `model` (an object: its id, registered in
    this process) and `model.lora` set from `peft_config` (a different `model.lora` in the
    config is refused); a one-line `ConfigValueError` for what cannot be."""
    update: dict[str, object] = {}
    if peft_config is not None:
        from rldojo.policy.lora import lora_section

        lora = lora_section(peft_config)
        if config.model.lora is not None and config.model.lora != lora:
            raise ConfigValueError("model.lora: set in the config and by peft_config=; give one")
        update["lora"] = lora
    if isinstance(model, str):
        if tokenizer is not None:
            raise ConfigValueError(
                "tokenizer: goes with a model object; a model name loads its own tokenizer"
            )
        update["name"] = model
    elif model is not None:
        update["name"] = _register(config, model, tokenizer)
    elif tokenizer is not None:
        raise ConfigValueError("tokenizer: goes with a model object (model=...)")
    return config.model_copy(update={"model": config.model.model_copy(update=update)})


def _register(
    config: TrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None
) -> str:
    """Check that the run can use `model` in this process, and register it; its id."""
    from transformers import PreTrainedModel

    from rldojo.policy.given_models import register_model
    from rldojo.policy.lora import is_peft_model
    from rldojo.policy.models import prepare_tokenizer

    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"model: expected a name or a transformers PreTrainedModel, got {type(model).__name__}"
        )
    if is_peft_model(model):
        raise ConfigValueError(
            "model: a peft model; pass its base model and the LoraConfig as peft_config="
        )
    refused = {
        "run.train_ranks": (config.run.train_ranks > 1, "set it to 1"),
        "torchrun": (int(os.environ.get("WORLD_SIZE", "1")) > 1, "run one process"),
        "run.cluster": (config.run.cluster == "ray", 'leave it "local"'),
        "generation.backend": (config.generation.backend == "vllm", 'use "native"'),
    }
    for key, (bad, fix) in refused.items():
        if bad:
            raise ConfigValueError(
                f"{key}: a model object lives in this process and "
                f"cannot reach others; {fix}, or give a model name"
            )
    tok = prepare_tokenizer(tokenizer) if tokenizer is not None else _default_tokenizer(model)
    return register_model(model, tok)


def _default_tokenizer(model: PreTrainedModel) -> Tokenizer:
    """The tokenizer of the model's `name_or_path`; a one-line error when none loads."""
    from rldojo.policy.models import load_tokenizer

    path = str(model.name_or_path or "")
    if not path:
        raise ConfigValueError(
            "tokenizer: required: the model object has no name_or_path to load its tokenizer from"
        )
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as exc:
        first = " ".join(str(exc).split())[:200]
        raise ConfigValueError(
            f"tokenizer: required: none loads from the model's name_or_path {path!r} ({first})"
        ) from None
    return tokenizer
