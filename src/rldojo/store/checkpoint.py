"""Checkpoints: model weights (safetensors), optimizer and scheduler state, RNG, step.

Layout: `RUN/checkpoints/step_000012/{model.safetensors, trainer.pt, state.json}`, plus
the tokenizer and config so a checkpoint directory loads with `from_pretrained`. A
checkpoint is written to a temporary directory and renamed, so a crash mid-write never
leaves a half checkpoint that `--resume` would pick up. Rewriting a step that exists (a
resumed run saving its last step again) first renames the old one away whole, so a crash
never leaves it half deleted under its own name; the next save removes what a crash left.

Sharded (`run.checkpoint_format = "dcp"`), the weights and the optimizer's state are
`dcp/` instead, torch.distributed.checkpoint's files, each rank writing its own shards
into the staging directory (`staging_dir`) before rank 0 adds the rest and renames it;
`config.json` is still written, and `rldojo.policy.models.load_model` loads such a
directory as a model (so `rldojo eval`, `export` and `serve` take it as they are).

Under LoRA the model's `save_pretrained` writes the adapter alone (`adapter_config.json`,
`adapter_model.safetensors`; `rldojo.policy.lora`). `trainer.pt` loads onto the host
(`map_location="cpu"`) whatever device wrote it: the optimizer moves its state to its
parameters' device, so a checkpoint written on a GPU resumes on a CPU and back.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch


class SavesPretrained(Protocol):
    """What a checkpoint writes of a tokenizer (`rldojo.policy.base.Tokenizer` has it)."""

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> object: ...


def save_checkpoint(
    directory: Path,
    *,
    model: Any,
    tokenizer: SavesPretrained,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    state: dict[str, Any],
    model_state: dict[str, Any] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    staged: Path | None = None,
) -> Path:
    """Write a complete checkpoint for `step` and return its directory. `model`: a
    transformers or a peft model (`Any`: their `save_pretrained` differ). `model_state`:
    the weights to write instead of `model`'s own (gathered from ranks), `optimizer_state`:
    the optimizer's state keyed by parameter name (`rldojo.training.distributed`), which
    loads on any world size, instead of `optimizer.state_dict()`. `staged`: the staging
    directory (`staging_dir`) whose `dcp/` already holds the weights and the optimizer's
    state; `model` gives its config alone."""
    final = directory / f"step_{step:06d}"
    tmp = staged
    if tmp is None:
        tmp = staging_dir(directory, step, os.getpid())
        tmp.mkdir()
    if staged is not None:
        model.config.save_pretrained(tmp)  # the weights are in dcp/
    elif hasattr(model, "peft_config"):  # a LoRA adapter: the vocabulary is never resized,
        # so the base's embeddings stay out (and peft does not ask the hub about them);
        # sharded, from the gathered `model_state` (peft keeps its adapters' entries)
        model.save_pretrained(
            tmp, safe_serialization=True, save_embedding_layers=False, state_dict=model_state
        )
    elif model_state is not None:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    by_name = optimizer_state is not None
    torch.save(
        {
            "optimizer": None if staged else optimizer_state if by_name else optimizer.state_dict(),
            "optimizer_by_name": by_name,
            "optimizer_in_dcp": staged is not None,
            "scheduler": scheduler.state_dict(),
            "rng_torch": torch.get_rng_state(),
            "rng_numpy": np.random.get_state(),
            "rng_python": random.getstate(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        },
        tmp / "trainer.pt",
    )
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    if final.exists():  # a directory can't be renamed over a non-empty one: move it aside
        old = directory / f".old_step_{step:06d}_{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    return final


def staging_dir(directory: Path, step: int, token: int) -> Path:
    """Where `step`'s checkpoint is written before its rename (made empty, with the
    leftovers of writers killed mid-save removed); `token` tells writers apart."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in [*directory.glob(".tmp_step_*"), *directory.glob(".old_step_*")]:
        shutil.rmtree(stale, ignore_errors=True)  # left by a writer killed mid-save
    return directory / f".tmp_step_{step:06d}_{token}"


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether `path` keeps its weights as torch.distributed.checkpoint files (`dcp/`)."""
    return (path / "dcp" / ".metadata").is_file()


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint under `directory`, or None."""
    if not directory.exists():
        return None
    done = sorted(p for p in directory.glob("step_*") if (p / "state.json").exists())
    return done[-1] if done else None


def load_trainer_state(
    checkpoint: Path,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    load_by_name: Callable[[dict[str, Any]], None] | None = None,
    load_by_position: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG from `checkpoint`; returns its state.json. An
    optimizer state keyed by parameter name goes to `load_by_name` (which knows the
    model); one by position (an older checkpoint's) to `load_by_position` when given (a
    sharded model's optimizer cannot take it as it is), else `optimizer.load_state_dict`."""
    blob = torch.load(checkpoint / "trainer.pt", weights_only=False, map_location="cpu")
    if blob.get("optimizer_in_dcp"):
        pass  # the caller restores it from dcp/ (`rldojo.training.distributed`)
    elif blob.get("optimizer_by_name"):
        if load_by_name is None:
            raise ValueError(
                f"{checkpoint}: its optimizer state is keyed by parameter name, "
                "which this run cannot read"
            )
        load_by_name(blob["optimizer"])
    elif load_by_position is not None:
        load_by_position(blob["optimizer"])
    else:
        optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["rng_torch"])
    np.random.set_state(blob["rng_numpy"])
    random.setstate(blob["rng_python"])
    cuda_rng = blob.get("rng_cuda")
    if cuda_rng is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_rng[: torch.cuda.device_count()])
    return dict(json.loads((checkpoint / "state.json").read_text()))
