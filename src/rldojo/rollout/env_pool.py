"""Environment worker processes: episodes run outside the trainer, every call under a timeout.

With `rollout.env_workers = N > 0` each episode's environment lives in one of N spawned
worker processes; the rollout engine drives it through a `RemoteEnv`, which has the `Env`
methods the engine calls (`reset`, `step`, `close`). An environment that blocks
synchronously, leaks memory or segfaults then costs one worker, not the run:

- the environment raises: the error comes back as `EnvCallError` (type and message) and
  the engine gives the rollout status `env_error`;
- a call outlives `timeout_s` (`rollout.env_timeout_s`): the rollout gets status
  `timeout`. The clock starts when the worker begins running the call: neither a
  worker's start-up (a fresh interpreter, slow on a loaded machine; bounded by
  `START_TIMEOUT_S` instead) nor a wait behind another episode's call counts. If the call
  holds its worker's event loop (blocking code, a busy loop, C), the worker is killed
  (the only way to stop it) and replaced on next use; if the loop is free (an `await`
  that never returns), the call is cancelled in the worker;
- a worker dies under an episode (crash, OOM kill, `kill -9`, or killed for another
  episode's timeout, also while this one's call waited its turn): the episode is
  replayed on a live worker with exponential backoff: a fresh environment, `reset` with
  the same task and seed, the same actions; its opening and every reply must match (the
  `Env` contract: the same task and seed give the same episode), else the rollout is
  `env_error`. A death during the episode's own call counts against its `retries` (its
  environment probably did it); a neighbour's does not (bounded anyway).

Workers are `rldojo.workers` processes (fresh interpreters, not forks: the trainer has
torch and producer threads a fork would copy mid-flight, and multiprocessing's spawn
would re-run the user's `__main__`); this module is the environment layer on top: where
episodes go, replay, and the pool's metrics. What runs inside a worker is in
`rldojo.rollout.env_host`. A worker runs its own event loop, so it serves many async
episodes at once; it exits when its socket to the trainer closes (and, on Linux, is
killed when the trainer dies). Factories travel by pickle: by reference when their
module imports by name, else by value (cloudpickle: scripts, closures).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import importlib.machinery
import itertools
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import cloudpickle

from rldojo.envs.registry import resolve_factory
from rldojo.graders.base import Grader
from rldojo.rollout import env_host
from rldojo.rollout.env_host import env_default_grader, spec_grader
from rldojo.types import Message, Observation, Rollout, Score, StepResult, Task
from rldojo.workers import CallError, WorkerDied, WorkerPool, WorkerProcess

__all__ = ["EnvCallError", "EnvWorkerPool", "RemoteEnv", "RemoteGrader", "WorkerDied"]

START_TIMEOUT_S = 120.0
"""How long a new worker may take to start serving calls (then it is killed)."""

T = TypeVar("T")

_OPS: dict[str, Callable[..., Any]] = {
    "open": env_host.open_env, "reset": env_host.reset_env,
    "step": env_host.step_env, "close": env_host.close_env,
}  # fmt: skip


class EnvCallError(RuntimeError):
    """The environment raised inside its worker; the message names the original error."""


def _importable(module: str) -> bool:
    """Whether a fresh interpreter with our `sys.path` can import `module` by name (not
    `importlib.util.find_spec`, which answers from `sys.modules`)."""
    top = module.partition(".")[0]
    if module == "__main__":
        return False
    if top in sys.builtin_module_names:
        return True
    return importlib.machinery.PathFinder.find_spec(top, sys.path) is not None


def _dumps(obj: object, module: str | None = None) -> bytes:
    """Pickle a factory or recipe for a worker: by reference what imports by name there
    (the worker gets the trainer's `sys.path`), by value the rest (scripts, test modules).
    `module`: where the user's code lives, when `obj` wraps it (a `functools.partial`)."""
    module = module or getattr(obj, "__module__", None) or "__main__"
    if not _importable(module) and module in sys.modules and module != "__main__":
        cloudpickle.register_pickle_by_value(sys.modules[module])
    return bytes(cloudpickle.dumps(obj))  # by reference where it can (plain pickle's way)


async def _call(
    worker: WorkerProcess,
    fn: Callable[..., object],
    args: tuple[object, ...],
    timeout_s: float,
    label: str,
) -> Any:
    """One call on `worker`, its failures as the engine reads them: `EnvCallError` (the
    code raised), `TimeoutError` (status `timeout`), `WorkerDied` (replay or retry)."""
    try:
        return await worker.call(fn, args, timeout_s=timeout_s, label=label)
    except CallError as exc:
        raise EnvCallError(str(exc)) from None
    except TimeoutError as exc:  # the call's, or its worker's start-up
        raise TimeoutError(str(exc)) from None


class EnvWorkerPool:
    """N environment worker processes; dead ones are replaced when next needed."""

    def __init__(
        self, workers: int, *, timeout_s: float = 30.0, retries: int = 2, backoff_s: float = 0.2
    ) -> None:
        if workers < 1:
            raise ValueError("EnvWorkerPool needs at least one worker")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        # die_with_parent: workers are started by the trainer's main thread or its async
        # producer's, both alive for the whole run. The initializer imports what every
        # call runs during the start-up, so the first call's timeout counts its own work.
        self._workers = WorkerPool(
            workers,
            name="env worker",
            start_timeout_s=START_TIMEOUT_S,
            die_with_parent=True,
            initializer=importlib.import_module,
            initargs=(env_host.__name__,),
        )
        self._keys = itertools.count()
        self._factories: dict[str, bytes] = {}
        self.replays = 0  # episodes replayed after their worker died
        self.regrades = 0  # grader calls retried after their worker died

    @property
    def _slots(self) -> list[WorkerProcess | None]:
        return self._workers.slots

    @property
    def started(self) -> int:
        """Worker processes started (the first N, then replacements)."""
        return self._workers.counters.started

    def metrics(self) -> dict[str, float]:
        return {
            "env_workers/replaced": self._workers.counters.replaced,
            "env_workers/replays": self.replays,
            "env_workers/regrades": self.regrades,
        }

    def worker(self) -> WorkerProcess:
        """The live worker with the fewest open episodes (starting any that are missing)."""
        return self._workers.worker()

    def make_env(self, env_id: str, kwargs: dict[str, Any]) -> RemoteEnv:
        if env_id not in self._factories:  # pickled once per environment id
            self._factories[env_id] = _dumps(resolve_factory(env_id))
        return RemoteEnv(self, env_id, self._factories[env_id], dict(kwargs), next(self._keys))

    def env_grader(self, env_id: str, kwargs: dict[str, Any], name: str) -> RemoteGrader:
        """The default grader of `env_id`, run in the workers."""
        factory = resolve_factory(env_id)
        recipe = functools.partial(env_default_grader, env_id, factory, dict(kwargs))
        return RemoteGrader(self, _dumps(recipe, factory.__module__), name)

    def spec_grader(self, spec: str | Path | Mapping[str, Any], name: str) -> RemoteGrader:
        """The grader of a spec (`rldojo.graders.load`), run in the workers."""
        return RemoteGrader(self, _dumps(functools.partial(spec_grader, spec)), name)

    def close(self) -> None:
        self._workers.close(grace_s=2.0)


class RemoteEnv:
    """The engine's handle on an environment in a worker; replays it if the worker dies.
    Every call is bounded by the pool's `timeout_s` (so the engine adds no timeout)."""

    enforces_timeouts = True

    def __init__(
        self, pool: EnvWorkerPool, env_id: str, factory: bytes, kwargs: dict[str, Any], key: int
    ) -> None:
        self.env_id, self._pool, self._factory, self._kwargs = env_id, pool, factory, kwargs
        self._key = key
        self._worker: WorkerProcess | None = None
        self._start: tuple[Task, int] | None = None
        self._opening: list[Message] = []  # the reset observation's messages (replay check)
        self._actions: list[tuple[str, str]] = []  # (action, digest of the env's reply)
        self.replays = 0

    async def reset(self, task: Task, *, seed: int) -> Observation:
        self._start = (task, seed)
        obs: Observation = await self._with_replay(self._open_and_reset)
        self._opening = list(obs.messages)
        return obs

    async def step(self, action: str) -> StepResult:
        async def step(worker: WorkerProcess) -> StepResult:
            result: StepResult = await self._call(worker, "step", action)
            return result

        result = await self._with_replay(step)
        self._actions.append((action, _digest(result)))
        if self.replays:
            result = StepResult(
                result.messages, result.done, {**result.info, "env/replays": self.replays}
            )
        return result

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and worker.alive:
            worker.residents -= 1
            await self._call(worker, "close")

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        raise NotImplementedError("a RemoteEnv runs episodes; ask the local env for tasks")

    def default_grader(self) -> Grader:
        raise NotImplementedError("a RemoteEnv runs episodes; ask the local env for its grader")

    async def _open_and_reset(self, worker: WorkerProcess) -> Observation:
        assert self._start is not None
        task, seed = self._start
        await self._call(worker, "open", self.env_id, self._factory, self._kwargs)
        obs: Observation = await self._call(worker, "reset", task, seed)
        return obs

    async def _call(self, worker: WorkerProcess, op: str, *args: object) -> Any:
        return await _call(worker, _OPS[op], (self._key, *args), self._pool.timeout_s, f"env.{op}")

    async def _with_replay(self, op: Callable[[WorkerProcess], Awaitable[T]]) -> T:
        """Run `op` on this episode's worker; if the worker dies, rebuild the episode on
        a live worker (reset + the same actions) and run `op` again."""
        attempt = 0
        while True:
            try:
                if self._worker is None:
                    self._worker = self._pool.worker()
                    self._worker.residents += 1
                    if self._opening:  # rebuilding after a worker died
                        await self._replay(self._worker)
                return await op(self._worker)
            except WorkerDied as exc:
                if self._worker is not None:
                    self._worker.residents -= 1
                self._worker = None
                # Charged: deaths in this episode's own call (or of unknown cause). Others
                # are a neighbour's doing; those replays are free but still bounded.
                attempt += 1 if exc.culprit else 0
                if attempt > self._pool.retries or self.replays >= 4 * self._pool.retries + 4:
                    raise WorkerDied(f"{exc} (after {self.replays} replays)") from None
                self.replays += 1
                self._pool.replays += 1
                await asyncio.sleep(self._pool.backoff_s * 2 ** min(self.replays - 1, 4))

    async def _replay(self, worker: WorkerProcess) -> None:
        """Rebuild the episode: the opening and every reply must be what they were."""
        obs = await self._open_and_reset(worker)
        same = list(obs.messages) == self._opening
        for action, digest in self._actions:
            if not same:
                break
            same = _digest(await self._call(worker, "step", action)) == digest
        if not same:
            raise EnvCallError(
                f"{self.env_id} is not deterministic for its task, seed and actions: cannot "
                "replay the episode after its worker died"
            )


def _digest(result: StepResult) -> str:
    """What a replayed step must reproduce: the env's messages and whether it ended."""
    text = repr((result.messages, result.done)).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


class RemoteGrader:
    """A grader that runs in the pool's workers, built there once per worker from its
    recipe. Every call is bounded by the pool's `timeout_s` (a grader that holds its
    worker's loop gets the worker killed); grading is idempotent, so a call whose worker
    died is retried on another with backoff: up to `retries` times when the death came
    during this call's own code, for free (bounded) when a neighbour's call caused it."""

    enforces_timeouts = True

    def __init__(self, pool: EnvWorkerPool, recipe: bytes, name: str) -> None:
        self._pool, self._recipe, self.name = pool, recipe, name

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        pool = self._pool
        charged = tries = 0
        while True:
            tries += 1
            try:
                args = (self._recipe, rollout, task)
                score: Score = await _call(
                    pool.worker(), env_host.grade, args, pool.timeout_s, "env.grade"
                )
                return score
            except WorkerDied as exc:  # charged only if this call was running (as episodes)
                charged += 1 if exc.culprit else 0
                if charged > pool.retries or tries > 4 * pool.retries + 4:
                    raise WorkerDied(f"{exc} (graded {tries} times)") from None
                pool.regrades += 1
                await asyncio.sleep(pool.backoff_s * 2 ** min(tries - 1, 4))
