"""Rollouts: run episodes of the policy in environments, then grade them.

`collect_rollouts` plays one episode per request with one of two engines (`engine`):
- **lockstep** (below; the default, and any policy without an inference engine): every
  live episode's conversation is encoded, the policy samples one turn for all of them in
  one batched call, and each environment answers its turn;
- **episodes** (`rldojo.rollout.concurrent`; a policy with an inference engine,
  `EnginePolicy`): each episode is its own coroutine, and its turns join the engine's
  running decode batch as they come, so environments step while the model decodes and
  no episode waits for the batch's slowest. Measured slower than lockstep on 2 CPU cores
  (docs/studies/2026-12-08-episodes-engine.md), so opt-in (`rollout.engine`).

Environment and policy failures become rollout statuses (`env_error`, `timeout`,
`policy_error`); they never raise out of here. `grade_rollouts` scores finished rollouts
concurrently with a per-rollout timeout; a grader that raises or hangs yields
`Score.failed(...)`, never a reward of 0. `play_and_grade` grades each episode as soon as
it ends (lockstep: after the batch). One episode's mechanics and its token bookkeeping:
`rldojo.rollout.episode`.

Progress (`collect_rollouts(progress=...)`, what an evaluation shows while it runs):
lockstep, per turn, how many of the turn's episodes have their answer sampled (a policy
whose `generate` takes `on_step` reports each answer as it ends; any other, the turn's
start and end); episodes, how many episodes ended, as turn 1.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Literal

from rldojo.envs.base import EnvFactory
from rldojo.graders.base import Grader, self_timed
from rldojo.policy.base import Policy, has_engine, streams_steps
from rldojo.rollout.concurrent import Ended, play
from rldojo.rollout.episode import (
    Episode,
    add_policy_turn,
    bounded,
    close_episode,
    env_turn,
    fail,
    per_task,
    reset,
    to_rollout,
)
from rldojo.types import Completion, Rollout, SamplingParams, Score, Task

if TYPE_CHECKING:
    from rldojo.policy.sampling import DecodeStep

__all__ = ["TurnProgress", "bounded", "collect_rollouts", "grade_rollouts", "play_and_grade"]

Engine = Literal["episodes", "lockstep"]
"""Which engine plays a batch (module docstring; `rollout.engine`)."""

Request = tuple[Task, int, int]
"""An episode to play: its task, its sample index in the task's group, its env seed."""

TurnProgress = Callable[[int, int, int], None]
"""`(turn, done, total)`: of the `total` episodes playing turn `turn` (1, 2, ...), `done`
have their answer sampled (see the module docstring)."""


async def collect_rollouts(
    make_env: EnvFactory,
    policy: Policy,
    tasks: Sequence[Request],
    sampling: SamplingParams,
    *,
    env_timeout_s: float = 30.0,
    max_turns: int = 8,
    max_episode_tokens: int | None = None,
    progress: TurnProgress | None = None,
    engine: Engine = "lockstep",
    on_end: Ended | None = None,
) -> list[Rollout]:
    """Run one episode per `(task, sample_index, seed)` and return their rollouts, in order;
    `progress` hears how far the generation got; `on_end(i, rollout)` is awaited as
    episode i ends (lockstep: after the batch). `engine="episodes"` plays the episodes
    engine where the policy has an inference engine (else lockstep)."""
    if has_engine(policy) and engine == "episodes":
        limits = (env_timeout_s, max_turns, max_episode_tokens)
        return await play(make_env, policy, tasks, sampling, limits, progress, on_end)
    rollouts = await _lockstep(
        make_env, policy, tasks, sampling, env_timeout_s, max_turns, max_episode_tokens, progress
    )
    if on_end is not None:
        await asyncio.gather(*(on_end(i, r) for i, r in enumerate(rollouts)))
    return rollouts


async def _lockstep(
    make_env: EnvFactory,
    policy: Policy,
    tasks: Sequence[Request],
    sampling: SamplingParams,
    env_timeout_s: float,
    max_turns: int,
    max_episode_tokens: int | None,
    progress: TurnProgress | None,
) -> list[Rollout]:
    """The lockstep engine: every episode reset before the first turn, one `generate`
    call per turn for every live episode, then every environment's answer."""
    episodes = [Episode(task, index, seed) for task, index, seed in tasks]
    factory = per_task(make_env)
    await asyncio.gather(*(reset(ep, factory, policy, env_timeout_s) for ep in episodes))
    turn = 0
    while live := [ep for ep in episodes if not ep.done]:
        prompts = [ep.prompt_ids + ep.ids for ep in live]
        params = replace(sampling, seed=None if sampling.seed is None else sampling.seed + turn)
        report = None if progress is None else partial(progress, turn + 1)
        try:
            completions = _generate(policy, prompts, params, report)
        except Exception as exc:  # a backend failure ends these episodes, it does not crash
            for ep in live:
                fail(ep, "policy_error", exc)
            break
        for ep, completion in zip(live, completions, strict=True):
            add_policy_turn(ep, completion)
            if ep.version < 0:  # the policy version that started this episode
                ep.version = policy.version
        await asyncio.gather(
            *(env_turn(ep, policy, env_timeout_s, max_turns, max_episode_tokens) for ep in live)
        )
        turn += 1
    await asyncio.gather(*(close_episode(ep) for ep in episodes))
    return [to_rollout(ep, ep.version if ep.version >= 0 else policy.version) for ep in episodes]


def _generate(
    policy: Policy,
    prompts: list[list[int]],
    params: SamplingParams,
    report: Callable[[int, int], None] | None,
) -> list[Completion]:
    """`policy.generate`, reporting `(done, total)` answers: at the start, as each ends
    (a policy whose `generate` takes `on_step`), and at the end."""
    if report is None:
        return policy.generate(prompts, params)
    total, done = len(prompts), 0
    report(0, total)

    def on_step(step: DecodeStep) -> None:
        nonlocal done
        ended = sum(reason is not None for reason in step.finished)
        if ended:
            done += ended
            report(done, total)

    if streams_steps(policy):
        completions = policy.generate(prompts, params, on_step=on_step)
    else:
        completions = policy.generate(prompts, params)
    if done < total:
        report(total, total)
    return completions


async def _grade_one(
    grader: Grader, rollout: Rollout, task: Task, timeout_s: float, gate: asyncio.Semaphore
) -> Score:
    if rollout.status not in ("ok", "truncated"):
        return Score.failed("error", f"rollout failed ({rollout.status}): {rollout.error}")
    async with gate:
        try:
            if self_timed(grader):  # e.g. graders in env workers
                return await grader.grade(rollout, task)
            return await asyncio.wait_for(grader.grade(rollout, task), timeout_s)
        except TimeoutError:
            return Score.failed("timeout", f"{grader.name} took longer than {timeout_s:.0f}s")
        except Exception as exc:
            return Score.failed("error", f"{grader.name} raised {type(exc).__name__}: {exc}")


async def grade_rollouts(
    grader: Grader,
    rollouts: Sequence[Rollout],
    tasks: Sequence[Task],
    *,
    timeout_s: float = 30.0,
    concurrency: int = 8,
) -> list[Score]:
    """Grade each rollout against its task; failures are statuses, in order."""
    gate = asyncio.Semaphore(concurrency)
    return list(
        await asyncio.gather(
            *(
                _grade_one(grader, r, t, timeout_s, gate)
                for r, t in zip(rollouts, tasks, strict=True)
            )
        )
    )


class _Grading:
    """Each rollout's grading, started the moment its episode ends (`on_end`)."""

    def __init__(self, grader: Grader, requests: Sequence[Request], timeout_s: float, n: int):
        self.grader, self.requests, self.timeout_s = grader, requests, timeout_s
        self.gate = asyncio.Semaphore(n)
        self.tasks: dict[int, asyncio.Task[Score]] = {}

    async def on_end(self, i: int, rollout: Rollout) -> None:
        task = self.requests[i][0]
        graded = _grade_one(self.grader, rollout, task, self.timeout_s, self.gate)
        self.tasks[i] = asyncio.ensure_future(graded)

    async def scores(self) -> list[Score]:
        return [await self.tasks[i] for i in range(len(self.requests))]


async def play_and_grade(
    make_env: EnvFactory,
    policy: Policy,
    grader: Grader,
    requests: Sequence[Request],
    sampling: SamplingParams,
    *,
    limits: tuple[float, int, int | None] = (30.0, 8, None),
    grade_timeout_s: float = 30.0,
    grade_concurrency: int = 8,
    engine: Engine = "lockstep",
    timing: dict[str, float] | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[list[Rollout], list[Score]]:
    """Rollouts and their scores, in request order. The episodes engine starts each
    episode's grading as soon as it ends, so grading overlaps the others' play; the
    lockstep engine grades the batch after it (`grade_rollouts`). `limits`:
    `(env_timeout_s, max_turns, max_episode_tokens)`. `timing` gains `time/generate`
    (until the last episode ended) and `time/grade` (the grading after it); `announce`
    hears what is being waited on."""
    overlap = has_engine(policy) and engine == "episodes"
    grading = _Grading(grader, requests, grade_timeout_s, grade_concurrency)
    if announce is not None:
        tasks = sorted({t.id for t, _, _ in requests})
        announce(f"generating {len(requests)} samples for tasks {tasks}")
    env_timeout_s, max_turns, max_tokens = limits
    t0 = time.perf_counter()
    rollouts = await collect_rollouts(
        make_env,
        policy,
        requests,
        sampling,
        env_timeout_s=env_timeout_s,
        max_turns=max_turns,
        max_episode_tokens=max_tokens,
        engine=engine,
        on_end=grading.on_end if overlap else None,
    )
    t1 = time.perf_counter()
    if announce is not None:
        announce(f"grading {len(rollouts)} samples with {grader.name}")
    if overlap:
        scores = await grading.scores()
    else:
        scores = await grade_rollouts(
            grader,
            rollouts,
            [t for t, _, _ in requests],
            timeout_s=grade_timeout_s,
            concurrency=grade_concurrency,
        )
    if timing is not None:
        timing["time/generate"] = timing.get("time/generate", 0.0) + t1 - t0
        timing["time/grade"] = timing.get("time/grade", 0.0) + time.perf_counter() - t1
    return rollouts, scores
