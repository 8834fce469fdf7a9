"""How many CPU threads each part of a run gets, so they never add up to more than the cores.

torch's intra-op pool spins its threads: two pools busy on the same cores at once are far
slower than one (a linear layer ran ~25x slower with 2 threads than with 1 on a
2-core machine that was busy with other work). The plan:

- the trainer (and in-process generation, which runs between training phases) uses
  every core this process may run on (`run.threads` overrides; so does
  `OMP_NUM_THREADS` when set);
- local Ray rollout workers split the cores among themselves while the trainer waits
  (synchronous), or share them with the trainer when it trains meanwhile (async): each
  worker gets `cores // (workers + 1)` and the trainer the rest;
- environment and grader worker processes run Python, not torch matmuls, and wait most
  of the time: they are listed, not given cores.

The plan is printed when a run starts and written into `summary.json`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadPlan:
    cores: int
    torch_threads: int
    """Intra-op threads of the trainer's process (training and in-process generation)."""
    ray_worker_threads: int | None = None
    """torch threads of each local Ray rollout worker (None: no Ray workers)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What else runs, and any oversubscription the config asked for explicitly."""

    def describe(self) -> str:
        parts = [f"{self.cores} cores", f"trainer {self.torch_threads} torch threads"]
        if self.ray_worker_threads is not None:
            parts.append(f"Ray workers {self.ray_worker_threads} threads each")
        return "; ".join(parts + list(self.notes))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_threads(
    *,
    cores: int,
    threads: int | None = None,
    omp_env: str | None = None,
    ray_workers: int = 0,
    ray_local: bool = True,
    ray_worker_threads: int | None = None,
    async_lag: int = 0,
    env_workers: int = 0,
    grade_in_workers: bool = False,
) -> ThreadPlan:
    """The thread plan for a run (pure: the machine's cores and the config's knobs in)."""
    notes: list[str] = []
    torch_threads = threads or _omp_threads(omp_env) or cores
    worker_threads = None
    if ray_workers > 0:
        overlap = async_lag > 0  # the trainer trains while the workers generate
        if not ray_local:
            worker_threads = ray_worker_threads  # remote nodes: Ray's or the config's
        else:
            share = max(1, cores // (ray_workers + (1 if overlap else 0)))
            worker_threads = ray_worker_threads or share
            if overlap and threads is None:
                torch_threads = max(1, cores - ray_workers * worker_threads)
            busy = ray_workers * worker_threads + (torch_threads if overlap else 0)
            if busy > cores:
                notes.append(f"oversubscribed: {busy} busy threads on {cores} cores")
    elif async_lag > 0:
        notes.append(
            "async in process: generation and training overlap on the same cores "
            "(only the idle tail of decoding is recovered; give generation its own "
            "hardware with run.cluster = 'ray' on other nodes or a GPU)"
        )
    if threads is not None and threads > cores:
        notes.append(f"oversubscribed: run.threads = {threads} on {cores} cores")
    if env_workers:
        notes.append(f"{env_workers} environment worker processes (Python, mostly waiting)")
    if grade_in_workers:
        notes.append("graders in worker processes (run while the trainer waits)")
    return ThreadPlan(cores, torch_threads, worker_threads, tuple(notes))


def _omp_threads(value: str | None) -> int | None:
    try:
        n = int(value) if value else 0
    except ValueError:
        return None
    return n if n > 0 else None


def apply_thread_plan(plan: ThreadPlan) -> None:
    """Set torch's intra-op threads of this process to the plan's."""
    import torch

    if torch.get_num_threads() != plan.torch_threads:
        torch.set_num_threads(plan.torch_threads)
