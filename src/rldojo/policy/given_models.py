"""Model objects given to a run (`rldojo.train(config, model=obj)`): an in-process registry.

A run names its model in its config (`model.name`), and the run's `config.toml` must stay
a file that any process can read. A model object cannot be written there, so
`register_model` keeps the object and its tokenizer in this process under an id,
`object:NAME.DIGEST`, that the config records in its place. `rldojo.policy.models.load_model`
returns the object itself for such an id, so the run trains it in place (as TRL's trainers
do), and `check_model` refuses, in one line, an id this process has not registered: a
resume in a new process, the CLI, a worker process.

The id is a digest of the object's class, `name_or_path` and config (never of its weights,
which training changes), so the same model given again, in this process or a new one, gets
the same id and its run resumes. Registering an id again replaces what it held.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from rldojo.policy.base import Tokenizer

__all__ = ["PREFIX", "given_model", "is_given", "model_id", "register_model"]

PREFIX = "object:"
"""What the `model.name` of a run on a given model starts with."""

_MODELS: dict[str, tuple[PreTrainedModel, Tokenizer]] = {}


def is_given(name: str) -> bool:
    """Whether `name` is the id of a given model (registered in this process or not)."""
    return name.startswith(PREFIX)


def model_id(model: PreTrainedModel) -> str:
    """`object:NAME.DIGEST`: NAME the last part of the model's `name_or_path` (else its
    class), DIGEST a digest of its class, `name_or_path` and config."""
    cls = type(model).__qualname__
    path = str(getattr(model, "name_or_path", "") or "")
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_")}
    data = json.dumps([cls, path, config], default=repr, sort_keys=True)
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", path.rstrip("/").rsplit("/", 1)[-1]).strip("_")
    return f"{PREFIX}{slug or cls}.{hashlib.sha256(data.encode()).hexdigest()[:12]}"


def register_model(model: PreTrainedModel, tokenizer: Tokenizer) -> str:
    """Keep `(model, tokenizer)` in this process; the id a config names them by."""
    name = model_id(model)
    _MODELS[name] = (model, tokenizer)
    return name


def given_model(name: str) -> tuple[PreTrainedModel, Tokenizer] | None:
    """`(model, tokenizer)` registered under `name` (the objects themselves); None when
    this process has registered none."""
    return _MODELS.get(name)
