"""The trainer's rollout side that runs outside its process: environments and graders in
worker processes (`rollout.env_workers`, `rollout.grade_in_workers`) and Ray rollout
workers (`run.cluster = "ray"`), built from the config before the first step."""

from __future__ import annotations

from typing import Any

from rldojo.config import TrainConfig
from rldojo.policy.training_model import vllm_memory_share
from rldojo.rollout.env_pool import EnvWorkerPool
from rldojo.rollout.mixture import MixtureGrader

__all__ = ["env_pool", "ray_pool", "remote_graders"]


def env_pool(config: TrainConfig) -> EnvWorkerPool | None:
    """The environments' worker processes (`rollout.env_workers` > 0), else None."""
    ro = config.rollout
    if ro.env_workers <= 0:
        return None
    return EnvWorkerPool(ro.env_workers, timeout_s=ro.env_timeout_s, retries=ro.env_retries)


def remote_graders(config: TrainConfig, envs: Any) -> tuple[EnvWorkerPool, MixtureGrader]:
    """Each environment's grader (or the spec's), built and run in worker processes of
    their own pool (with the grade timeout); the pool and the grader over it."""
    ro, spec = config.rollout, config.grader.spec
    pool = EnvWorkerPool(
        max(1, ro.env_workers), timeout_s=ro.grade_timeout_s, retries=ro.env_retries
    )
    grader = MixtureGrader(
        {
            env_id: pool.spec_grader(spec, slot.grader.name)
            if spec is not None
            else pool.env_grader(env_id, slot.kwargs, slot.grader.name)
            for env_id, slot in envs.slots.items()
        }
    )
    return pool, grader


def ray_pool(config: TrainConfig, entries: list) -> Any:
    """Ray actors that sample, play and grade (`rollout.workers` of them), each loading
    the model and the environments of `entries`."""
    from rldojo.cluster.ray_pool import RayRolloutPool, WorkerSampler

    cfg = config
    ro = cfg.rollout
    sampler = WorkerSampler(
        cfg.generation.backend,
        cfg.model.generation_dtype,
        cfg.run.seed,
        vllm_memory_share(cfg),
        cfg.generation.prefix_cache_mb,
    )
    args = (
        cfg.model.name,
        entries,
        cfg.grader.spec,
        sampler,
        ro.env_timeout_s,
        ro.grade_timeout_s,
        ro.max_turns,
        ro.worker_threads,
    )
    return RayRolloutPool(
        workers=ro.workers,
        actor_args=args,
        address=cfg.run.ray_address,
        timeout_s=ro.worker_timeout_s,
        num_gpus=ro.worker_gpus,
    )
