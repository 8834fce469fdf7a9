"""Generating and grading rounds of rollouts: the one place groups are made.

`Generation` turns `(task, sample_index, seed)` requests into rollouts and their scores:
`LocalGeneration` runs the policy, environments and grader in this process (env and
grader worker pools are hidden behind `make_env` and the grader); `RayGeneration` sends
the requests to Ray actors, which generate, play and grade there. A vLLM or remote
backend is another `Policy` behind `LocalGeneration`, or another `Generation`.

`Rounds.run` is one round for every source: reuse the round if the ledger already holds
it (a resumed run redoes nothing graded), else generate and grade, commit to the ledger
(durable before anything trains on it), cut into groups, and report the groups to the
task sampler (the curriculum learns here, whatever the source).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence, Sized
from typing import Protocol

from rldojo.config import RolloutConfig
from rldojo.envs.base import EnvFactory
from rldojo.graders.base import Grader
from rldojo.policy.base import Policy, has_engine
from rldojo.rollout.episodes import play_and_grade
from rldojo.rollout.groups import Group, make_groups, requests
from rldojo.rollout.tasks import TaskSampler
from rldojo.store.ledger import Ledger
from rldojo.types import Rollout, SamplingParams, Score, Task

__all__ = ["ActorPool", "Generation", "LocalGeneration", "RayGeneration", "Rounds"]

Request = tuple[Task, int, int]
Announce = Callable[[str], None]


class Generation(Protocol):
    """Turns requests into graded rollouts: `LocalGeneration`, `RayGeneration`, or yours."""

    async def run(
        self,
        requests: list[Request],
        sampling: SamplingParams,
        timing: dict[str, float],
        announce: Announce | None = None,
    ) -> tuple[list[Rollout], list[Score]]:
        """Rollouts and scores, in request order; phase times are added to `timing` and
        `announce` hears what is being waited on."""
        ...

    def version(self) -> int:
        """The policy version generating now (the trainer's weight updates so far)."""
        ...


def _add(timing: dict[str, float], key: str, seconds: float) -> None:
    timing[key] = timing.get(key, 0.0) + seconds


class LocalGeneration:
    """The policy, environments and grader of this process (`rldojo.rollout.episodes`)."""

    def __init__(
        self, make_env: EnvFactory, policy: Policy, grader: Grader, cfg: RolloutConfig
    ) -> None:
        self.make_env, self.policy, self.grader, self.cfg = make_env, policy, grader, cfg

    def version(self) -> int:
        return self.policy.version

    async def run(
        self,
        requests: list[Request],
        sampling: SamplingParams,
        timing: dict[str, float],
        announce: Announce | None = None,
    ) -> tuple[list[Rollout], list[Score]]:
        ro = self.cfg
        engine = has_engine(self.policy) and ro.engine == "episodes"
        start = self.policy.engine_stats() if engine and has_engine(self.policy) else None
        rollouts, scores = await play_and_grade(
            self.make_env,
            self.policy,
            self.grader,
            requests,
            sampling,
            limits=(ro.env_timeout_s, ro.max_turns, ro.max_episode_tokens),
            grade_timeout_s=ro.grade_timeout_s,
            grade_concurrency=ro.grade_concurrency,
            engine=ro.engine,
            timing=timing,
            announce=announce,
        )
        if start is not None and has_engine(self.policy):
            engine_metrics(start, self.policy.engine_stats(), timing)
        return rollouts, scores


def engine_metrics(
    start: dict[str, float], end: dict[str, float], timing: dict[str, float]
) -> None:
    """What the inference engine did over a round (`EnginePolicy.engine_stats` before and
    after), added to `timing` (under `time/`: they depend on timing, as which requests
    share a decode step does): `time/decode_batch` (mean rows per decode step) and
    `time/engine_busy` (the share of generation's wall time the engine spent in the
    model; the rest, it waited on environments)."""
    d = {k: end.get(k, 0.0) - start.get(k, 0.0) for k in end}
    wall = timing.get("time/generate", 0.0)
    if d.get("decode_steps", 0.0) > 0:
        timing["time/decode_batch"] = d["decode_rows"] / d["decode_steps"]
    if wall > 0:
        timing["time/engine_busy"] = min(1.0, d.get("busy_s", 0.0) / wall)


class ActorPool(Protocol):
    """What `RayGeneration` needs of `rldojo.cluster.ray_pool.RayRolloutPool` (a layer
    above this one): its actors, and graded rollouts for requests spread over them."""

    @property
    def actors(self) -> Sized: ...

    def run(
        self, requests: Sequence[Request], sampling: SamplingParams, group_size: int
    ) -> tuple[list[Rollout], list[Score]]: ...


class RayGeneration:
    """Generation, environments and grading on Ray actors (`rldojo.cluster.ray_pool`)."""

    def __init__(self, pool: ActorPool, group_size: int, version: Callable[[], int]) -> None:
        self.pool, self.group_size, self._version = pool, group_size, version

    def version(self) -> int:
        return self._version()

    async def run(
        self,
        requests: list[Request],
        sampling: SamplingParams,
        timing: dict[str, float],
        announce: Announce | None = None,
    ) -> tuple[list[Rollout], list[Score]]:
        if announce is not None:
            tasks = sorted({t.id for t, _, _ in requests})
            where = f"on {len(self.pool.actors)} Ray workers"
            announce(f"generating {len(requests)} samples {where} for tasks {tasks}")
        t0 = time.perf_counter()
        rollouts, scores = self.pool.run(requests, sampling, self.group_size)
        _add(timing, "time/generate", time.perf_counter() - t0)
        timing.setdefault("time/grade", 0.0)  # graded on the actors, inside generate
        return rollouts, scores


class Rounds:
    """One round of groups, the same for every source (see the module docstring)."""

    def __init__(
        self,
        tasks: TaskSampler,
        generation: Generation,
        cfg: RolloutConfig,
        sampling: Callable[[int], SamplingParams],
    ) -> None:
        self.tasks, self.generation, self.cfg, self.sampling = tasks, generation, cfg, sampling

    def version(self) -> int:
        return self.generation.version()

    async def run(
        self,
        tasks: Sequence[Task],
        seed: int,
        *,
        ledger: Ledger,
        step: int,
        round: int,
        timing: dict[str, float],
        announce: Announce | None = None,
        any_step: bool = False,
    ) -> list[Group]:
        """Task i's G samples seeded `seed + i`, committed as ledger round `(step, round)`;
        `any_step` reuses a committed `round` whatever its step (the asynchronous
        producer's rounds are numbered across steps)."""
        reqs = requests(tasks, self.cfg.group_size, seed)
        committed = ledger.find_round(None if any_step else step, round)
        if len(committed) == len(reqs):  # graded before a crash: reuse, don't redo
            ids = [i for i, _, _ in committed]
            rollouts, scores = [r for _, r, _ in committed], [s for _, _, s in committed]
            _add(timing, "rollout/reused", len(ids))
        else:
            sampling = self.sampling(seed)
            rollouts, scores = await self.generation.run(reqs, sampling, timing, announce)
            ids = ledger.add(step, rollouts, scores, round=round)  # durable first
        groups = make_groups(tasks, rollouts, scores, ids, self.cfg.group_size)
        self.tasks.observe(groups)
        return groups
