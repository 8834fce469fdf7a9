"""Where a GRPO run's graded groups come from: its rollout side, rank 0's.

`Experience` owns what turns tasks into graded groups for the GRPO objective
(`rldojo.training.grpo`): the task sampler with its curriculum, the environment and
grader worker pools (`rollout.env_workers`, `rollout.grade_in_workers`), the Ray rollout
workers (`run.cluster = "ray"`), the generation rounds, the ledger (every graded rollout,
durable before anything trains on it) and the rollout source (`rldojo.rollout.sources`),
started by the first step. Sharded, rank 0 alone has one; the other ranks get its groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rldojo.envs.base import Env
from rldojo.graders.base import Grader
from rldojo.rollout.env_pool import EnvWorkerPool
from rldojo.rollout.generation import Generation, LocalGeneration, RayGeneration, Rounds
from rldojo.rollout.groups import Collected
from rldojo.rollout.mixture import EnvMixture
from rldojo.rollout.sources import RolloutSource, make_source
from rldojo.rollout.tasks import TaskSampler
from rldojo.store.ledger import Ledger
from rldojo.training import rollout_workers
from rldojo.training.inputs import build_curriculum, env_entries
from rldojo.training.run import Run
from rldojo.types import SamplingParams, Task

if TYPE_CHECKING:
    from rldojo.cluster.ray_pool import RayRolloutPool

__all__ = ["Experience"]


class Experience:
    """The task sampler, worker pools, rounds, ledger and rollout source of a GRPO run."""

    def __init__(
        self, run: Run, envs: EnvMixture, grader: Grader, version: Callable[[], int]
    ) -> None:
        """`envs` and `grader`: the run's; `version`: the trainer's policy version now
        (what Ray workers sample with)."""
        cfg = run.config
        self.run = run
        self.curriculum = build_curriculum(cfg, envs, run.pass_threshold)
        self.tasks = TaskSampler(envs, self.curriculum, seed=cfg.run.seed)
        self.envs, self.grader = envs, grader
        self.env_pool = rollout_workers.env_pool(cfg)
        self.grader_pool: EnvWorkerPool | None = None  # graders in workers (own timeout)
        if cfg.rollout.grade_in_workers:
            self.grader_pool, self.grader = rollout_workers.remote_graders(cfg, envs)
        self.ray_pool: RayRolloutPool | None = None
        if cfg.run.cluster == "ray":
            self.ray_pool = rollout_workers.ray_pool(cfg, env_entries(cfg))
        assert run.policy is not None  # rank 0's, where the experience is
        generation: Generation = (
            LocalGeneration(self.make_env, run.policy, self.grader, cfg.rollout)
            if self.ray_pool is None  # else generation, envs and grading on Ray actors
            else RayGeneration(self.ray_pool, cfg.rollout.group_size, version)
        )
        self.rounds = Rounds(self.tasks, generation, cfg.rollout, self.sampling)
        self.ledger = Ledger(run.run_dir / "ledger.sqlite")
        self.source: RolloutSource | None = None  # started by the first step
        self.async_next_batch = 0  # the async producer's next batch (continues on resume)

    def make_env(self, task: Task) -> Env:
        if self.env_pool is not None:
            slot = self.envs.slot_for(task)
            return self.env_pool.make_env(slot.env_id, slot.kwargs)
        return self.envs.make_env_for(task)

    def sampling(self, seed: int | None = None) -> SamplingParams:
        return self.run.sampling(seed)

    def collect(self, step: int, version: int) -> Collected:
        """Graded groups for `step` (`rldojo.rollout.sources`), generated with the policy
        of `version`."""
        return self.rollout_source().collect(step, version)

    def rollout_source(self) -> RolloutSource:
        """The source of graded groups, started on first use: after a resume has restored
        the draw position, and after the "before" evaluation (an asynchronous producer
        would otherwise generate alongside it)."""
        if self.source is None:
            run = self.run
            self.source = make_source(
                self.rounds,
                run.config.rollout,
                self.ledger,
                run.loop,
                seed=run.config.run.seed,
                next_batch=self.async_next_batch,
                step=lambda: run.step_num,
            )
        return self.source

    def worker_metrics(self) -> dict[str, float]:
        """The environment and grader worker pools' counts for a step's metrics."""
        metrics: dict[str, float] = {}
        if self.env_pool is not None:
            metrics |= self.env_pool.metrics()
        if self.grader_pool is not None:
            metrics |= {
                f"grade/workers_{k.split('/')[1]}": v for k, v in self.grader_pool.metrics().items()
            }
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The draw position a checkpoint keeps (an asynchronous producer draws ahead:
        what it has handed over so far)."""
        if self.source is None:
            draws = self.tasks.state_dict()
        else:
            draws = self.source.checkpoint_state()
            self.async_next_batch = draws.pop("next_batch")
        return {**draws, "async_next_batch": self.async_next_batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tasks.load_state_dict(state)
        self.async_next_batch = int(state.get("async_next_batch", 0))

    def close(self) -> None:
        if self.ray_pool is not None:
            self.ray_pool.close()
        if self.source is not None:
            self.source.close()
        for pool in (self.env_pool, self.grader_pool):
            if pool is not None:
                pool.close()
        self.ledger.close()
