"""The run's machine-dependent settings, resolved once before anything is loaded.

`resolve_resources` turns the config's `"auto"` values into what this machine does best
(`rldojo.hardware`): the thread plan is applied first (the precision probe is timed with
the run's threads), then `model.generation_dtype` and `model.autocast_bf16` are resolved.
The returned config holds the resolved values, so the run's `config.toml` records them
and a resume computes in the same precision as the run it continues. `run.device` is
resolved first (`rldojo.policy.device`; a missing GPU is a one-line error) and kept as
written: `Precision.device` says where this process computes.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from rldojo.config import TrainConfig
from rldojo.hardware import (
    Precision,
    ThreadPlan,
    apply_thread_plan,
    plan_threads,
    resolve_precision,
    usable_cores,
)
from rldojo.policy.device import resolve_device


def thread_plan(config: TrainConfig) -> ThreadPlan:
    ro, run = config.rollout, config.run
    return plan_threads(
        cores=usable_cores(),
        threads=run.threads,
        omp_env=os.environ.get("OMP_NUM_THREADS"),
        ray_workers=ro.workers if run.cluster == "ray" else 0,
        ray_local=run.ray_address is None,
        ray_worker_threads=ro.worker_threads,
        async_lag=ro.max_policy_lag,
        env_workers=ro.env_workers,
        grade_in_workers=ro.grade_in_workers,
    )


def resolve_resources(config: TrainConfig) -> tuple[TrainConfig, Precision, ThreadPlan]:
    """Apply the thread plan and resolve the precision; the config with concrete values."""
    plan = thread_plan(config)
    apply_thread_plan(plan)
    device = resolve_device(config.run.device)
    precision = resolve_precision(
        config.model.generation_dtype, config.model.autocast_bf16, device=str(device)
    )
    model = config.model.model_copy(
        update={
            "generation_dtype": precision.generation_dtype,
            "autocast_bf16": precision.autocast_bf16,
        }
    )
    rollout = config.rollout
    if plan.ray_worker_threads is not None and rollout.worker_threads is None:
        rollout = rollout.model_copy(update={"worker_threads": plan.ray_worker_threads})
    return config.model_copy(update={"model": model, "rollout": rollout}), precision, plan


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed Python's, NumPy's and torch's generators; `run.deterministic`: torch's
    deterministic kernels where it has them (a warning where it has not)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
