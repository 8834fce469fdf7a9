"""Environment worker processes: episodes run outside the trainer, every call under a timeout.

With `rollout.env_workers = N > 0` each episode's environment lives in one of N spawned
worker processes; the rollout engine drives it through a `RemoteEnv`, which has the `Env`
methods the engine calls (`reset`, `step`, `close`). An environment that blocks
synchronously, leaks memory or segfaults then costs one worker, not the run:

- the environment raises: the error comes back as `EnvCallError` (type and message) and
  the engine gives the rollout status `env_error`;
- a call outlives `timeout_s` (`rollout.env_timeout_s`): the rollout gets status
  `timeout`. The clock starts once the call's worker serves calls: a worker's start-up
  (a fresh interpreter, slow on a loaded machine) is bounded by `START_TIMEOUT_S` instead.
  If the call holds its worker's event loop (blocking code, a busy loop, C), the worker
  is killed (the only way to stop it) and replaced on next use; if the loop
  is free (an `await` that never returns), the call is cancelled in the worker;
- a worker dies under an episode (crash, OOM kill, `kill -9`, or killed for another
  episode's timeout): the episode is replayed on a live worker with exponential backoff:
  a fresh environment, `reset` with the same task and seed, the same actions; its opening
  and every reply must match (the `Env` contract: the same task and seed give the same
  episode), else the rollout is `env_error`. A death during the episode's own call
  counts against its `retries` (its environment probably did it); a neighbour's does
  not (bounded anyway).

Workers are fresh interpreters (`rldojo.rollout.env_worker`), not forks: the
trainer has torch and producer threads a fork would copy mid-flight, and multiprocessing's
spawn would re-run the user's `__main__`. A worker runs its own event loop, so it serves
many async episodes at once; it exits when its socket to the trainer closes (and, on
Linux, is killed when the trainer dies). Factories travel by pickle: by reference when
their module imports by name, else by value (cloudpickle: scripts, closures).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.machinery
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from rldojo.envs.registry import resolve_factory
from rldojo.rollout.env_worker import READY, RunningCall, env_default_grader, spec_grader
from rldojo.types import Observation, StepResult, Task

log = logging.getLogger("rldojo.env_workers")

START_TIMEOUT_S = 120.0
"""How long a new worker may take to start serving calls (then it is killed)."""


class WorkerDied(RuntimeError):
    """The worker process that held an episode exited before answering. `culprit`: the
    call was running in the worker when it died (its environment likely did it)."""

    def __init__(self, message: str, *, culprit: bool = False) -> None:
        super().__init__(message)
        self.culprit = culprit


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


def _dumps(obj: Any, module: str | None = None) -> bytes:
    """Pickle a factory or recipe for a worker: by reference what imports by name there
    (the worker gets the trainer's `sys.path`), by value the rest (scripts, test modules).
    `module`: where the user's code lives, when `obj` wraps it (a `functools.partial`)."""
    module = module or getattr(obj, "__module__", None) or "__main__"
    if not _importable(module) and module in sys.modules and module != "__main__":
        cloudpickle.register_pickle_by_value(sys.modules[module])
    return bytes(cloudpickle.dumps(obj))  # by reference where it can (plain pickle's way)


# ---------------------------------------------------------------------- trainer side


class _Worker:
    """One worker process (`python -m rldojo.rollout.env_worker FD MEM`), its socket, and the
    calls waiting on it. A fresh interpreter, not a fork or multiprocessing spawn: nothing
    of the trainer's threads is copied and the user's `__main__` is not re-imported."""

    _ids = itertools.count()

    def __init__(self, name: str) -> None:
        mine, theirs = socket.socketpair()
        fd, mem = theirs.fileno(), os.memfd_create("rldojo-env-running")
        os.ftruncate(mem, 8)
        self.running = RunningCall(mem)
        self.running.set(-1)
        cmd = [sys.executable, "-m", "rldojo.rollout.env_worker", str(fd), str(mem)]
        self.process = subprocess.Popen(cmd, pass_fds=[fd, mem], stdin=subprocess.DEVNULL)
        theirs.close()
        os.close(mem)  # the mapping stays
        self.name = name
        self.conn = Connection(mine.detach())
        self.conn.send(sys.path)
        self.episodes = 0  # open environments on this worker
        self.in_flight = 0  # calls waiting on it
        self._pending: dict[int, tuple[asyncio.Future, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # calls come from several event loops' threads
        self.alive = True
        self.ready = False  # it has said READY: it serves calls
        self._ready_waiters: list[tuple[asyncio.Future, asyncio.AbstractEventLoop]] = []
        threading.Thread(target=self._read, name=f"{name}-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                rid, ok, payload = self.conn.recv()
                if rid == READY:
                    self._wake_ready()
                    continue
                with self._lock:
                    waiter = self._pending.pop(rid, None)
                if waiter is not None:
                    error = None if ok else EnvCallError(payload)
                    _wake(waiter[1], waiter[0], payload, error)
        except (EOFError, OSError):
            pass
        try:
            code: int | str | None = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = "still running"
        why = f"env worker pid {self.process.pid} exited ({code})"
        culprit = self.running.get()
        with self._lock:
            self.alive = False
            waiting, self._pending = dict(self._pending), {}
        for rid, (fut, loop) in waiting.items():  # unknown cause (-1): everyone is suspect
            _wake(loop, fut, None, WorkerDied(why, culprit=culprit in (rid, -1)))
        self._wake_ready()  # who waits for the start-up learns of the death from its call

    def _wake_ready(self) -> None:
        with self._lock:
            self.ready = self.alive
            waiters, self._ready_waiters = self._ready_waiters, []
        for fut, loop in waiters:
            _wake(loop, fut, None, None)

    async def _started(self, fut: asyncio.Future) -> bool:
        """Wait until the worker serves calls, or `fut` (a call on it) is settled; False
        when neither happened within `START_TIMEOUT_S`."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.ready or not self.alive:
                return True
            ready = loop.create_future()
            self._ready_waiters.append((ready, loop))
        done, _ = await asyncio.wait({ready, fut}, timeout=START_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        ready.cancel()  # if still pending: a later wake finds it done and leaves it
        return bool(done)

    def _submit(self, op: str, key: int, args: tuple) -> tuple[int, asyncio.Future]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if not self.alive:
                raise WorkerDied(f"env worker pid {self.process.pid} is gone")
            rid = next(self._ids)
            self._pending[rid] = (fut, loop)
        try:
            with self._send_lock:
                self.conn.send((rid, op, key, args))
        except (OSError, ValueError) as exc:  # the socket broke: the worker is gone
            self._forget(rid)
            raise WorkerDied(f"env worker pid {self.process.pid}: {exc}") from None
        return rid, fut

    def _forget(self, rid: int) -> None:
        with self._lock:
            self._pending.pop(rid, None)

    async def call(self, op: str, key: int, *args: Any, timeout_s: float | None = None) -> Any:
        """Run `op` on the worker. Past `timeout_s`, find out why: if this call holds the
        worker's event loop (or the worker cannot even say), kill the worker; if the loop
        is idle, the call awaits something that never comes: cancel it there. Either way
        the call times out. If another call holds the loop, wait for that one's fate (its
        own timeout kills the worker and this episode replays), one more timeout at most."""
        rid, fut = self._submit(op, key, args)
        self.in_flight += 1
        try:
            return await self._wait(op, key, rid, fut, timeout_s)
        finally:
            self.in_flight -= 1

    def load(self) -> int:
        """How busy it is, for placing new work: resident episodes plus calls in flight."""
        return self.episodes + self.in_flight

    async def _wait(
        self, op: str, key: int, rid: int, fut: asyncio.Future, timeout_s: float | None
    ) -> Any:
        if timeout_s is None:
            return await fut
        loop = asyncio.get_running_loop()
        try:
            if not await self._started(fut):
                self._forget(rid)
                self.kill(f"it did not start within {START_TIMEOUT_S:.0f}s")
                raise TimeoutError(f"env worker did not start within {START_TIMEOUT_S:.0f}s")
            deadline = loop.time() + timeout_s  # from the start of the worker, not before
            hard = deadline + timeout_s
            while True:
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), deadline - loop.time())
                except TimeoutError:
                    pass
                blocker = await self._who_runs()
                if blocker == "dead":  # killed meanwhile (another call's timeout): replay
                    return await fut
                if blocker == rid or blocker == "unknown" or loop.time() >= hard:
                    self._forget(rid)
                    self.kill(f"env.{op} held the worker for {timeout_s:.0f}s")
                    break
                if blocker is None:  # the loop is free: this call waits on nothing
                    self._forget(rid)
                    self._submit("cancel", key, (rid,))
                    break
                deadline = min(hard, loop.time() + 0.2)  # someone else blocks the loop
        finally:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" noise for a dead worker
        raise TimeoutError(f"env.{op} took longer than {timeout_s:.0f}s")

    async def _who_runs(self) -> int | str | None:
        """The request whose code is running in the worker now (None: none), `unknown`
        when the worker does not answer (stuck holding the GIL), `dead` when it is gone."""
        try:
            rid, fut = self._submit("who", -1, ())
            return await asyncio.wait_for(fut, 1.0)  # type: ignore[no-any-return]
        except WorkerDied:
            return "dead"
        except TimeoutError:
            self._forget(rid)
            return "unknown"

    def hang_up(self) -> None:
        """Shut the socket down (wakes our reader thread too); the worker sees EOF, exits."""
        try:
            sock = socket.socket(fileno=self.conn.fileno())
            sock.shutdown(socket.SHUT_RDWR)
            sock.detach()
        except OSError:
            pass

    def is_alive(self) -> bool:
        return self.alive and self.process.poll() is None

    def kill(self, why: str) -> None:
        if self.process.poll() is None:
            log.warning("killing env worker pid %s: %s", self.process.pid, why)
            self.process.kill()


def _settle(fut: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if fut.done():  # cancelled by a timeout meanwhile
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _wake(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, value: Any,
          error: BaseException | None) -> None:  # fmt: skip
    try:
        loop.call_soon_threadsafe(_settle, fut, value, error)
    except RuntimeError:  # that event loop is closed: nobody is waiting any more
        pass


class EnvWorkerPool:
    """N environment worker processes; dead ones are replaced when next needed."""

    def __init__(
        self, workers: int, *, timeout_s: float = 30.0, retries: int = 2, backoff_s: float = 0.2
    ) -> None:
        if workers < 1:
            raise ValueError("EnvWorkerPool needs at least one worker")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._slots: list[_Worker | None] = [None] * workers
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._factories: dict[str, bytes] = {}
        self.started = 0  # worker processes started (the first N, then replacements)
        self.replays = 0  # episodes replayed after their worker died
        self.regrades = 0  # grader calls retried after their worker died

    def metrics(self) -> dict[str, float]:
        n = len(self._slots)
        return {
            "env_workers/replaced": max(0, self.started - n),
            "env_workers/replays": self.replays,
            "env_workers/regrades": self.regrades,
        }

    def worker(self) -> _Worker:
        """The live worker with the fewest open episodes (starting any that are missing)."""
        with self._lock:
            for i, w in enumerate(self._slots):
                if w is None or not w.is_alive():
                    self._slots[i] = _Worker(f"rldojo-env-{i}")
                    self.started += 1
            return min((w for w in self._slots if w is not None), key=_Worker.load)

    def make_env(self, env_id: str, kwargs: dict[str, Any]) -> RemoteEnv:
        if env_id not in self._factories:  # pickled once per environment id
            self._factories[env_id] = _dumps(resolve_factory(env_id))
        return RemoteEnv(self, env_id, self._factories[env_id], dict(kwargs), next(self._keys))

    def env_grader(self, env_id: str, kwargs: dict[str, Any], name: str) -> RemoteGrader:
        """The default grader of `env_id`, run in the workers."""
        factory = resolve_factory(env_id)
        recipe = functools.partial(env_default_grader, env_id, factory, dict(kwargs))
        return RemoteGrader(self, _dumps(recipe, factory.__module__), name)

    def spec_grader(self, spec: Any, name: str) -> RemoteGrader:
        """The grader of a spec (`rldojo.graders.load`), run in the workers."""
        return RemoteGrader(self, _dumps(functools.partial(spec_grader, spec)), name)

    def close(self) -> None:
        with self._lock:
            workers, self._slots = [w for w in self._slots if w], [None] * len(self._slots)
        for w in workers:
            w.hang_up()
        for w in workers:
            try:
                w.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait(timeout=2)


class RemoteEnv:
    """The engine's handle on an environment in a worker; replays it if the worker dies.
    Every call is bounded by the pool's `timeout_s` (so the engine adds no timeout)."""

    enforces_timeouts = True

    def __init__(
        self, pool: EnvWorkerPool, env_id: str, factory: bytes, kwargs: dict, key: int
    ) -> None:
        self.env_id, self._pool, self._factory, self._kwargs = env_id, pool, factory, kwargs
        self._key = key
        self._worker: _Worker | None = None
        self._start: tuple[Task, int] | None = None
        self._opening: list[Any] = []  # the reset observation's messages (replay check)
        self._actions: list[tuple[str, str]] = []  # (action, digest of the env's reply)
        self.replays = 0

    async def reset(self, task: Task, *, seed: int) -> Observation:
        self._start = (task, seed)
        obs: Observation = await self._with_replay(self._open_and_reset)
        self._opening = list(obs.messages)
        return obs

    async def step(self, action: str) -> StepResult:
        async def step(worker: _Worker) -> StepResult:
            result: StepResult = await self._call(worker, "step", action)
            return result

        result = await self._with_replay(step)
        self._actions.append((action, _digest(result)))
        if self.replays:
            result = StepResult(result.messages, result.done, {**result.info,
                                "env/replays": self.replays})  # fmt: skip
        return result

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and worker.alive:
            worker.episodes -= 1
            await self._call(worker, "close")

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Any:
        raise NotImplementedError("a RemoteEnv runs episodes; ask the local env for tasks")

    def default_grader(self) -> Any:
        raise NotImplementedError("a RemoteEnv runs episodes; ask the local env for its grader")

    async def _open_and_reset(self, worker: _Worker) -> Observation:
        assert self._start is not None
        task, seed = self._start
        await self._call(worker, "open", self.env_id, self._factory, self._kwargs)
        obs: Observation = await self._call(worker, "reset", task, seed)
        return obs

    async def _call(self, worker: _Worker, op: str, *args: Any) -> Any:
        return await worker.call(op, self._key, *args, timeout_s=self._pool.timeout_s)

    async def _with_replay(self, op: Callable[[_Worker], Any]) -> Any:
        """Run `op` on this episode's worker; if the worker dies, rebuild the episode on
        a live worker (reset + the same actions) and run `op` again."""
        attempt = 0
        while True:
            try:
                if self._worker is None:
                    self._worker = self._pool.worker()
                    self._worker.episodes += 1
                    if self._opening:  # rebuilding after a worker died
                        await self._replay(self._worker)
                return await op(self._worker)
            except WorkerDied as exc:
                if self._worker is not None:
                    self._worker.episodes -= 1
                self._worker = None
                # Charged: deaths in this episode's own call (or of unknown cause). Others
                # are a neighbour's doing; those replays are free but still bounded.
                attempt += 1 if exc.culprit else 0
                if attempt > self._pool.retries or self.replays >= 4 * self._pool.retries + 4:
                    raise WorkerDied(f"{exc} (after {self.replays} replays)") from None
                self.replays += 1
                self._pool.replays += 1
                await asyncio.sleep(self._pool.backoff_s * 2 ** min(self.replays - 1, 4))

    async def _replay(self, worker: _Worker) -> None:
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

    async def grade(self, rollout: Any, task: Task) -> Any:
        pool = self._pool
        charged = tries = 0
        while True:
            tries += 1
            try:
                return await pool.worker().call(
                    "grade", -1, self._recipe, rollout, task, timeout_s=pool.timeout_s
                )
            except WorkerDied as exc:  # charged only if this call was running (as episodes)
                charged += 1 if exc.culprit else 0
                if charged > pool.retries or tries > 4 * pool.retries + 4:
                    raise WorkerDied(f"{exc} (graded {tries} times)") from None
                pool.regrades += 1
                await asyncio.sleep(pool.backoff_s * 2 ** min(tries - 1, 4))
