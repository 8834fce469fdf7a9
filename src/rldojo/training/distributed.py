"""Training on several ranks: torch.distributed with FSDP2, launched by torchrun.

    torchrun --nproc-per-node 2 -m rldojo sft CONFIG --data demos.jsonl
    rldojo sft CONFIG --data demos.jsonl --nproc 2          # the same, on this machine

A process started by torchrun (`WORLD_SIZE` > 1 in its environment) joins the process
group here: gloo on the CPU, NCCL on CUDA (each rank its `LOCAL_RANK` device), with a
timeout on every collective (`run.dist_timeout_s`), so a rank that dies makes the others
fail with an error naming the lost rank instead of hanging. With `run.shard` "auto" or
"fsdp" the model is sharded with FSDP2 (`fully_shard`): each decoder layer, then the
whole model, so parameters, gradients and the optimizer's state are split across ranks
and one layer's full weights exist at a time. `run.shard = "fsdp"` in one process shards
over a group of one (for `run.cpu_offload` on one GPU).

What the objectives need from it (`Dist`): which rank writes (rank 0 writes the run
directory, the others compute), sums and broadcasts across ranks, how a step's rows are
dealt to the ranks, and the weights gathered into rank 0's whole copy for sampling, one
tensor at a time (`gather_into`). Loading straight into the shards:
`rldojo.training.sharded_load`; checkpoints on several ranks:
`rldojo.training.rank_checkpoints`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from rldojo.config import ConfigValueError, TrainConfig

__all__ = [
    "Dist",
    "check_shardable",
    "full_state_dict",
    "gather_into",
    "init_dist",
    "is_sharded",
    "rank_device",
    "rank_micro_batches",
    "shard_model",
    "world_size_from_env",
]


def world_size_from_env() -> int:
    """The world size torchrun announced (1 when started another way)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class Dist:
    """This process's place among the ranks; no process group unless `sharded` (several
    ranks, or `run.shard = "fsdp"` in one process: a group of one)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sharded: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # collectives'
    # tensors live here: the rank's GPU under NCCL

    @property
    def main(self) -> bool:
        """Whether this rank writes the run directory (rank 0)."""
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def sum(self, value: float) -> float:
        """`value` summed over the ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t[0])

    def sum_all(self, values: dict[str, float]) -> dict[str, float]:
        """Each of `values` summed over the ranks, in one collective (every rank passes
        the same keys)."""
        if self.world == 1:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist(), strict=True))

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks (a new tensor on `t`'s device; `t` itself when one
        rank): rows only one rank filled, the others left 0, make the whole."""
        if self.world == 1:
            return t
        out = t.to(self.device, copy=True)
        dist.all_reduce(out)
        return out.to(t.device)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first (e.g. makes a directory), the others after it."""
        if not self.main:
            self.barrier()
        yield
        if self.main:
            self.barrier()

    def close(self) -> None:
        if self.sharded and dist.is_initialized():
            dist.destroy_process_group()


def init_dist(shard: str, device: torch.device, timeout_s: float) -> Dist:
    """Join the process group torchrun set up; whether the model is sharded follows
    `run.shard`. One process (`WORLD_SIZE` 1) has no group, unless `run.shard = "fsdp"`:
    then a group of one, so FSDP2 shards over it (its CPU offload on one GPU,
    `run.cpu_offload`). Raises `ConfigValueError` for several ranks with `run.shard =
    "none"` (each rank would train its own copy)."""
    world = world_size_from_env()
    if world == 1 and shard != "fsdp":
        return Dist()
    if shard == "none":
        raise ConfigValueError(f"run.shard = 'none' with {world} ranks: each rank would "
                               "train a copy of its own; use 'auto' or 'fsdp'")  # fmt: skip
    backend = "nccl" if device.type == "cuda" else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    here = torch.device("cpu")
    if device.type == "cuda":  # before the group: NCCL's collectives use this GPU
        here = torch.device("cuda", local if world > 1 else device.index or 0)
        torch.cuda.set_device(here)
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if world == 1:  # no torchrun: a group of one, its store in this process
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)  # fmt: skip
        else:
            dist.init_process_group(backend, timeout=timeout)
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local,
                sharded=True, device=here)  # fmt: skip


def rank_device(name: str, d: Dist) -> torch.device:
    """This rank's device: `name` (resolved `run.device`), on CUDA the `LOCAL_RANK`-th GPU."""
    device = torch.device(name)
    if d.world > 1 and device.type == "cuda":
        device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(device)
    return device


def rank_micro_batches(step: Sequence[Sequence[int]], d: Dist, size: int
                       ) -> tuple[list[list[int]], int]:  # fmt: skip
    """This rank's micro-batches of a step's rows, and how many of them are padding.

    One rank: the step's own micro-batches. Several: the rows dealt round the ranks in
    their order (SFT sorts a step's rows longest first, so each rank gets a like share of
    tokens; GRPO's come group by group, so a micro-batch keeps rows of one group, whose
    prompt is computed once), cut into micro-batches of `size`; a rank with fewer
    micro-batches than the most repeats the step's first row at weight 0, since every
    forward pass of a sharded model is a collective all ranks take part in. Rank 0 never
    pads (it is dealt first)."""
    if d.world == 1:
        return [list(mb) for mb in step], 0
    rows = [i for mb in step for i in mb]
    counts = [-(-len(rows[r :: d.world]) // size) for r in range(d.world)]
    mine = rows[d.rank :: d.world]
    out = [mine[k : k + size] for k in range(0, len(mine), size)]
    padding = max(counts) - len(out)
    out += [[rows[0]]] * padding
    return out, padding


def check_shardable(config: TrainConfig, d: Dist, device: torch.device) -> None:
    """Refuse (one line) what sharded training cannot do here: LoRA adapters in sharded
    checkpoint files (an adapter checkpoint is the adapters alone, written whole),
    `run.cpu_offload` unless the model is sharded on CUDA (several ranks, or `run.shard =
    "fsdp"` in one process), and sharding a model object given to the run (it trains in
    place; FSDP would leave it split into shards)."""
    from rldojo.policy.given_models import is_given

    if config.run.checkpoint_format == "dcp" and config.model.lora is not None:
        raise ConfigValueError("run.checkpoint_format = 'dcp' keeps whole models, not LoRA "
                               "adapters: use 'hf' with model.lora")  # fmt: skip
    if config.run.cpu_offload and (not d.sharded or device.type != "cuda"):
        where = "one process unsharded (run.shard = 'fsdp' shards it)" if not d.sharded \
            else f"the {device.type} device"  # fmt: skip
        raise ConfigValueError(f"run.cpu_offload moves sharded state off CUDA ranks; this is "
                               f"{where}: leave it false")  # fmt: skip
    if d.sharded and is_given(config.model.name):
        raise ConfigValueError("run.shard: a model object given to the run trains in place "
                               "and cannot be sharded; use run.shard = 'auto' in one process, "
                               "or pass the model's directory as model.name")  # fmt: skip


def shard_model(model: Any, d: Dist, device: torch.device, bf16: bool = False, *,
                offload: bool = False) -> Any:  # fmt: skip
    """FSDP2 over `d`'s ranks: each decoder layer, then the model (its embeddings, final
    norm and output layer; tied weights stay tied). The reduce-scatter averages the ranks'
    gradients (gloo has no pre-multiplied sum), so an objective whose ranks compute parts
    of one sum scales its loss by the world size (`Dist.world`). `bf16` (the resolved
    `model.autocast_bf16`): the gathered weights compute in bf16 while the shards (the
    master weights) and the gradients' reduction stay fp32. `offload` (`run.cpu_offload`):
    the shards, their gradients and the optimizer's state live in host memory."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mesh = init_device_mesh(device.type, (d.world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if bf16 else MixedPrecisionPolicy()  # fmt: skip
    place = CPUOffloadPolicy() if offload else OffloadPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=place)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=place)
    return model


def is_sharded(model: Any) -> bool:
    """Whether `model` was sharded by `shard_model` (an FSDP2 module)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks of a causal LM (`model.model.layers` for Llama-like models;
    the base model's under LoRA)."""
    for holder in (model, getattr(model, "base_model", None)):
        inner = getattr(getattr(holder, "model", None), "model", None) or getattr(
            holder, "model", None
        )
        layers = getattr(inner, "layers", None)
        if layers is not None:
            return list(layers)
    raise ValueError(f"no decoder layers found in {type(model).__name__} to shard")


def full_state_dict(model: Any, d: Dist, *, trainable_only: bool = False) -> dict[str, Any]:
    """The model's full state dict on the CPU, on rank 0 (empty on the others); every rank
    must call it (it gathers the shards). `trainable_only`: the parameters that train
    alone (under LoRA the adapters: what changes from step to step)."""
    if not d.sharded:
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        return {k: v.detach().cpu() for k, v in model.state_dict().items()
                if not (trainable_only and k in frozen)}  # fmt: skip
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True,
                               ignore_frozen_params=trainable_only)  # fmt: skip
    return get_model_state_dict(model, options=options)


def gather_into(model: Any, whole: Any, d: Dist, *, adapters_only: bool = False) -> None:
    """Every rank sends its shards of `model`; rank 0 copies the gathered weights into
    `whole`, its unsharded copy for sampling or evaluating (None on the other ranks), one
    tensor at a time: no second whole model is ever gathered beside it. `adapters_only`:
    under LoRA only the adapters change, so only they are gathered."""
    if not d.sharded:
        if whole is not None and whole is not model:
            whole.load_state_dict(full_state_dict(model, d, trainable_only=adapters_only),
                                  strict=not adapters_only)  # fmt: skip
        return
    targets = whole.state_dict() if whole is not None else {}
    done: set[int] = set()  # a tied weight is gathered once
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            frozen = isinstance(t, torch.nn.Parameter) and not t.requires_grad
            if (adapters_only and frozen) or id(t) in done:
                continue
            done.add(id(t))
            full = _full_tensor(t.detach())  # collective for a shard
            if whole is not None:
                targets[name].copy_(full)


def _full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value on every rank (its shards offloaded to the host are moved
    to the mesh's device for the all-gather); a plain tensor as it is."""
    if not hasattr(t, "full_tensor"):
        return t
    mesh_device = t.device_mesh.device_type  # type: ignore[attr-defined]
    if t.device.type != mesh_device:
        t = t.to(mesh_device)
    return t.full_tensor()  # type: ignore[attr-defined]
