"""The `[run]` section: how long a run trains, where it writes, how it stops.

A run directory (`run.output_dir`/`run.name`) holds one run: `rldojo train`, `sft` and
`distill` refuse to start in one that already holds a run unless told to resume or
overwrite it (`rldojo.store.run_dir`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from rldojo.config.base import _Section

Tracker = Literal["tensorboard", "wandb", "trackio", "mlflow"]


class RunConfig(_Section):
    steps: int = Field(12, ge=0)
    """Optimizer steps to train (a resumed run trains up to this many in all): RL and
    distillation draw tasks for this many steps."""
    epochs: int = Field(2, gt=0)
    """Passes over a fixed training set, which sets the run's length instead of `steps`:
    SFT's demonstrations (`sft.batch_size` a step)."""
    max_minutes: float | None = Field(None, gt=0)
    """Wall-clock budget of this invocation's training steps, in minutes (None: none). No
    step starts once it is spent: the run then evaluates ("after"), checkpoints and
    summarises as it would at `steps` (`summary.json`: `stopped` is "max_minutes", else
    "steps"). The step under way finishes, so a run overshoots by at most one step; the
    starting evaluation is not counted; a resumed run has the whole budget again."""
    max_failure_rate: float = Field(0.5, gt=0.0, le=1.0)
    """The failure budget (`rldojo.training.failure_budget`): the run stops (exit 1, checkpoints
    kept, `summary.json` `stopped` = "failures") when more than this share of the rollouts
    of the last `failure_window` steps failed (an episode or a grade with a non-ok status),
    or when every rollout of its first step failed. 1 turns it off."""
    failure_window: int = Field(2, gt=0)
    """Steps the failure budget counts over."""
    seed: int = 0
    """Seeds task order, sampling and initialisation: the same seed, the same run."""
    output_dir: str = "runs"
    """Directory the run directories are created in."""
    name: str | None = None
    """Run directory name under output_dir (default: timestamp)."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every K steps (0: only at the end)."""
    deterministic: bool = False
    """Deterministic torch kernels and single-threaded grading order (same metrics per run)."""
    threads: int | None = Field(None, gt=0)
    """torch intra-op threads of the trainer (None: every core this process may use, or
    `OMP_NUM_THREADS` when set); local Ray workers share the cores (`rldojo.hardware.threads`)."""
    cluster: Literal["local", "ray"] = "local"
    """`ray`: rollout workers (generation, environments, grading) run as Ray actors."""
    ray_address: str | None = None
    """An existing Ray cluster (`ray://host:10001`, `auto`); None starts a local instance."""
    train_ranks: int = Field(1, gt=0)
    """`rldojo train` with `run.cluster = "ray"`: N > 1 trains on N ranks started as Ray
    actors on the cluster (`rldojo.cluster.train_ranks`), sharded as under torchrun
    (`run.shard`); rank 0 also owns the rollout workers. The `rldojo train` process waits
    for the ranks, prints rank 0's output and fails in one line naming a rank whose actor
    died. N > 1 with `run.cluster = "local"` is refused: on one machine, `--nproc N`
    (torchrun). `rldojo sft` and `distill` do not read it (torchrun launches them)."""
    train_rank_gpus: float = Field(0.0, ge=0.0)
    """GPUs each Ray training rank reserves (Ray's `num_gpus`; 0 on the CPU). On CUDA give
    each rank a GPU of its own (1): NCCL refuses two ranks on one GPU."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """Where the policy, the KL reference, the optimizer state and the batches live:
    `auto` (CUDA device 0 when torch sees one, else the CPU), `cpu`, `cuda` or `cuda:N`.
    On CUDA training runs under bf16 autocast and generation in bf16 unless
    `model.generation_dtype`/`model.autocast_bf16` say otherwise. A CUDA device this
    machine lacks is a one-line error before any model loads (`rldojo.policy.device`)."""
    shard: Literal["auto", "none", "fsdp"] = "auto"
    """How a run launched on several ranks (`torchrun --nproc-per-node N -m rldojo ...`, or
    `--nproc N`) trains: `auto` shards with FSDP2 when there are several ranks (one rank:
    no sharding), `fsdp` always shards, `none` refuses several ranks. Each decoder layer
    and the whole model are sharded (`rldojo.training.distributed`): `rldojo train` (rank
    0 rolls out and keeps the ledger, every rank trains on its share of the groups),
    `rldojo sft` and `rldojo distill`, LoRA adapters included. `fsdp` in one process
    shards over a group of one: with `run.cpu_offload` on one GPU, the weights, gradients
    and optimizer state live in host memory (not for a model object given to the run)."""
    cpu_offload: bool = False
    """On CUDA with a sharded model (several ranks, or `run.shard = "fsdp"` on one GPU):
    keep the parameter shards, their gradients and the optimizer's state in host memory
    (FSDP2's `CPUOffloadPolicy`; the optimizer step runs on the CPU), which frees GPU
    memory for activations at the cost of host-device copies every step. Refused on the
    CPU and in one unsharded process (one line). Has not run on a GPU yet."""
    checkpoint_format: Literal["hf", "dcp"] = "hf"
    """How checkpoints keep the weights and the optimizer's state: `hf`, whole, in the
    Hugging Face layout (`model.safetensors`; on several ranks gathered on rank 0 first),
    `dcp`, as torch.distributed.checkpoint files each rank writes its own shards of
    (`dcp/`; nothing gathered, for models whose state does not fit one host). Both
    resume on any world size, and `rldojo eval`, `export` and `serve` read both (a `dcp`
    checkpoint is assembled in one process). Not with `model.lora`."""
    dist_timeout_s: float = Field(600.0, gt=0)
    """Longest wait on another rank (a collective): a rank that died makes the others
    stop with an error after at most this long, never hang."""
    report_to: list[Tracker] = Field(default_factory=lambda: list[Tracker](["tensorboard"]))
    """Metric sinks besides `metrics.jsonl` (always written), as TRL's `report_to`:
    `tensorboard` (RUN/tensorboard/), `wandb`, `trackio`, `mlflow` (extra `trackers`:
    `pip install 'rldojo[trackers]'`); `[]` for the JSONL file alone."""

    @field_validator("train_ranks")
    @classmethod
    def _ranks_need_ray(cls, ranks: int, info: ValidationInfo) -> int:
        """Ranks as Ray actors need Ray; torchrun is the local way (`--nproc N`)."""
        if ranks > 1 and info.data.get("cluster") != "ray":
            raise PydanticCustomError(
                "ranks_need_ray",
                "{ranks} ranks as Ray actors need run.cluster = 'ray'; on this machine "
                "use rldojo train --nproc {ranks} (torchrun) instead",
                {"ranks": ranks},
            )
        return ranks
