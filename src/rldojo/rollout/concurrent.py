"""The episodes engine: every episode its own coroutine over an inference engine that
batches continuously.

Each episode opens, plays its turns and closes on its own: it asks the policy's engine
(`EnginePolicy.agenerate`) for one turn at a time, and that request joins the running
decode batch at the engine's next step; while the model decodes, the other episodes'
environments step, and an episode whose environment is slow delays only itself. As an
episode ends, `on_end(i, rollout)` is awaited (grading it at once, `play_and_grade`).

Bounds: an environment that holds a bounded resource (`BoundedEnv.max_episodes_at_once`,
web-crm-v1's browser contexts) is opened by at most that many episodes of this call at
once; the others wait for a slot before their `reset`, and that wait is no part of their
`env_timeout_s` (which bounds each call of the environment's own). So a batch of any size
runs on an environment that holds fewer episodes at once.

Seeds: episode i's turn t samples with seed `row_seeds(sampling.seed + t, n)[i]`, the seed
the lockstep engine gives row i of a batch of n in its turn t: a single-turn batch draws
the same seeds under both engines, and a request's tokens depend on no other request
in flight (the engine seeds each request alone), up to float summation order: which
requests share a decode step depends on timing, and a batched matmul may sum in another
order. The lockstep engine's batches are fixed, so `rollout.engine = "lockstep"` is the
mode whose runs repeat bit for bit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING

from rldojo.envs.base import BoundedEnv, Env, EnvFactory
from rldojo.policy.base import EnginePolicy
from rldojo.rollout.episode import (
    Episode,
    add_policy_turn,
    close_episode,
    env_turn,
    fail,
    per_task,
    reset,
    to_rollout,
)
from rldojo.types import Rollout, SamplingParams, Task

if TYPE_CHECKING:
    from rldojo.rollout.episodes import TurnProgress

__all__ = ["Ended", "Limits", "play"]

Ended = Callable[[int, Rollout], Awaitable[None]]
"""`(i, rollout)`: awaited as episode i ends (e.g. to grade it)."""

Limits = tuple[float, int, int | None]
"""`(env_timeout_s, max_turns, max_episode_tokens)`."""


class _Gates:
    """One semaphore per bounded environment kind (`BoundedEnv`), made on first use."""

    def __init__(self) -> None:
        self._gates: dict[tuple[str, int], asyncio.Semaphore] = {}

    def of(self, env: Env | None) -> AbstractAsyncContextManager[object]:
        if env is None or not isinstance(env, BoundedEnv):
            return nullcontext()
        limit = int(env.max_episodes_at_once)
        key = (getattr(env, "env_id", "") or type(env).__name__, limit)
        return self._gates.setdefault(key, asyncio.Semaphore(limit))


class _Seeds:
    """Each episode's seed per turn (see the module docstring), one list per turn."""

    def __init__(self, seed: int | None, n: int) -> None:
        self.seed, self.n = seed, n
        self._turns: dict[int, list[int | None]] = {}

    def __call__(self, i: int, turn: int) -> int | None:
        if self.seed is None:
            return None
        if turn not in self._turns:
            from rldojo.policy.token_choice import row_seeds  # torch: not at `import rldojo`

            self._turns[turn] = row_seeds(self.seed + turn, self.n)
        return self._turns[turn][i]


async def _play_one(
    ep: Episode,
    i: int,
    make_env: Callable[[Task], Env],
    policy: EnginePolicy,
    sampling: SamplingParams,
    seeds: _Seeds,
    limits: Limits,
    gates: _Gates,
) -> None:
    """Open, play and close one episode; every failure becomes its status."""
    env_timeout_s, max_turns, max_tokens = limits
    try:
        ep.env = make_env(ep.task)
    except Exception as exc:  # an environment failure is a status, not a crash
        fail(ep, "env_error", exc)
        return
    async with gates.of(ep.env):
        await reset(ep, make_env, policy, env_timeout_s)
        turn = 0
        while not ep.done:
            params = replace(sampling, seed=seeds(i, turn))
            try:
                completion = await policy.agenerate(ep.prompt_ids + ep.ids, params)
            except Exception as exc:  # a backend failure ends this episode, not the run
                fail(ep, "policy_error", exc)
                break
            add_policy_turn(ep, completion)
            if ep.version < 0:  # the policy version that started this episode
                ep.version = policy.version
            await env_turn(ep, policy, env_timeout_s, max_turns, max_tokens)
            turn += 1
        await close_episode(ep)


async def play(
    make_env: EnvFactory,
    policy: EnginePolicy,
    requests: Sequence[tuple[Task, int, int]],
    sampling: SamplingParams,
    limits: Limits,
    progress: TurnProgress | None = None,
    on_end: Ended | None = None,
) -> list[Rollout]:
    """Play one episode per `(task, sample_index, seed)`, each its own coroutine; their
    rollouts in request order. `progress(1, ended, total)` hears each end."""
    factory, gates = per_task(make_env), _Gates()
    seeds = _Seeds(sampling.seed, len(requests))
    total, ended = len(requests), 0
    if progress is not None:
        progress(1, 0, total)

    async def one(i: int, request: tuple[Task, int, int]) -> Rollout:
        nonlocal ended
        ep = Episode(*request)
        await _play_one(ep, i, factory, policy, sampling, seeds, limits, gates)
        rollout = to_rollout(ep, ep.version if ep.version >= 0 else policy.version)
        ended += 1
        if progress is not None:
            progress(1, ended, total)
        if on_end is not None:
            await on_end(i, rollout)
        return rollout

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))
