"""Checkpoints of a run on several ranks: every rank takes part, rank 0 writes.

A checkpoint of any world size resumes on any other. `save_on_ranks` writes one in the
run's `run.checkpoint_format`: `hf`, the whole weights in the Hugging Face layout (gathered
on rank 0, unless rank 0 already holds them whole) and the optimizer's state keyed by
parameter name, gathered too; `dcp`, each rank's shards of both as torch.distributed
.checkpoint files (`stage_sharded_checkpoint`: nothing gathered). `restore_trainer_state`
reads whichever it finds, also a one-process checkpoint's optimizer state kept by
position (mapped to names). The layout itself is `rldojo.store.checkpoint`'s.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import torch

from rldojo.store.checkpoint import (
    is_sharded_checkpoint,
    load_trainer_state,
    save_checkpoint,
    staging_dir,
)
from rldojo.training.distributed import Dist, full_state_dict

__all__ = [
    "checkpoint_weights",
    "load_optimizer_state",
    "load_positional_optimizer_state",
    "optimizer_state",
    "restore_trainer_state",
    "save_on_ranks",
    "stage_sharded_checkpoint",
]


def save_on_ranks(directory: Path, step: int, *, model: Any, writer: Any, tokenizer: Any,
                  optimizer: torch.optim.Optimizer, scheduler: Any, state: dict[str, Any],
                  d: Dist, files: str, gather: bool, by_name: bool = False) -> Path:  # fmt: skip
    """`step`'s checkpoint of `model` (sharded or not; every rank calls it) in the format
    `files` (`run.checkpoint_format`); rank 0 writes `writer` (the module whose config, and
    unless `gather`, whose weights it writes: its whole copy when that is current).
    `gather`: the weights are gathered from the shards first. The optimizer's state is
    keyed by parameter name when sharded (or `by_name`), else by position. Returns the
    checkpoint's directory once it is there for every rank."""
    staged = weights = optim = None
    if files == "dcp":  # each rank writes its shards
        staged = stage_sharded_checkpoint(directory, step, model, optimizer, d)
    elif d.sharded or by_name:
        weights = checkpoint_weights(model, d) if d.sharded and gather else None
        optim = optimizer_state(model, optimizer, d)
    if d.main:
        save_checkpoint(directory, model=writer, tokenizer=tokenizer, optimizer=optimizer,
                        scheduler=scheduler, step=step, state=state, model_state=weights,
                        optimizer_state=optim, staged=staged)  # fmt: skip
    d.barrier()  # the others read it only once it is there
    return directory / f"step_{step:06d}"


def checkpoint_weights(model: Any, d: Dist) -> dict[str, Any]:
    """`full_state_dict` as a checkpoint keeps it: a tied output layer is the input
    embedding, written once (as a one-process `save_pretrained` writes it)."""
    weights = full_state_dict(model, d)
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)
    return weights


def optimizer_state(model: Any, optimizer: torch.optim.Optimizer, d: Dist) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, whole, on rank 0 (collective)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         d: Dist) -> None:  # fmt: skip
    """Restore `optimizer_state`'s output on any world size (each rank read the whole
    state from the checkpoint and keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)  # every rank read the file
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=options)


def load_positional_optimizer_state(model: Any, optimizer: torch.optim.Optimizer,
                                    state: dict[str, Any], d: Dist) -> None:  # fmt: skip
    """Restore an optimizer state keyed by position (`optimizer.state_dict()` of one
    process, as checkpoints before sharded training kept it) on any world size: position
    k is the k-th trained parameter in the model's order, which names it."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    by_name = {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}
    load_optimizer_state(model, optimizer, by_name, d)


def stage_sharded_checkpoint(directory: Path, step: int, model: Any,
                             optimizer: torch.optim.Optimizer, d: Dist) -> Path:  # fmt: skip
    """`run.checkpoint_format = "dcp"`: every rank writes its shards of the weights and of
    the optimizer's state (torch.distributed.checkpoint, into `dcp/` of `step`'s staging
    directory; nothing is gathered); returns that directory, for rank 0 to finish
    (`rldojo.store.checkpoint.save_checkpoint(staged=...)`). Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    staged = d.broadcast(staging_dir(directory, step, os.getpid()) if d.main else None)
    if d.main:
        staged.mkdir()
    d.barrier()  # made (and the leftovers of killed writers removed) before anyone writes
    weights, optim = get_state_dict(model, optimizer)
    dcp.save({"model": weights, "optim": optim}, checkpoint_id=str(staged / "dcp"),
             no_dist=d.world == 1)  # fmt: skip
    return Path(staged)


def restore_trainer_state(checkpoint: Path, model: Any, optimizer: torch.optim.Optimizer,
                          scheduler: Any, d: Dist) -> dict[str, Any]:  # fmt: skip
    """`checkpoint`'s optimizer and schedule state, RNG and state.json (returned), on any
    world size: an optimizer state kept by parameter name, by position (a one-process
    checkpoint's), or as each rank's shards (`dcp/`, read resharded to this world)."""
    by_name = partial(load_optimizer_state, model, optimizer, d=d)
    by_position = None  # one process takes it as it is; sharded, mapped to names
    if d.sharded:
        by_position = partial(load_positional_optimizer_state, model, optimizer, d=d)
    state = load_trainer_state(checkpoint, optimizer, scheduler, by_name, by_position)
    if is_sharded_checkpoint(checkpoint):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        optim = get_optimizer_state_dict(model, optimizer)
        dcp.load({"optim": optim}, checkpoint_id=str(checkpoint / "dcp"), no_dist=d.world == 1)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=optim)
    return state
