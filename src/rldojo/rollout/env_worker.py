"""The environment worker process: `python -m rldojo.rollout.env_worker FD MEM`.

Its trainer-side counterpart, and the failure semantics, are in `rldojo.rollout.env_workers`.
The worker reads `(request_id, op, key, args)` from the socket FD: `open` builds an
environment from a pickled factory, `reset`/`step`/`close` drive it, `grade` scores a
rollout with a grader built from a pickled recipe (once per worker); each runs as a task on
the worker's event loop, so async environments share a worker. A reader thread answers
`who` (which call's code is running now, also while the loop is blocked) and `cancel`.
The running call's id is also kept in 8 shared bytes (MEM) so that after a crash the
trainer knows whose call it was. Its first message, `(READY, True, pid)`, says that it has
started and serves calls (the trainer does not count its start-up against a call's timeout).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import pickle
import signal
import struct
import sys
import threading
import types
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rldojo.envs.registry import build_env

READY = -1
"""The request id of the worker's first message: it has started and serves calls (request
ids are >= 0)."""


class RunningCall:
    """Which request's code runs in the worker now (-1: none): 8 bytes of memory shared
    by worker and trainer, so after a crash the trainer knows whose call caused it."""

    def __init__(self, fd: int) -> None:
        self._mem = mmap.mmap(fd, 8)

    def set(self, rid: int) -> None:
        struct.pack_into("q", self._mem, 0, rid)

    def get(self) -> int:
        return int(struct.unpack_from("q", self._mem, 0)[0])


def _die_with_parent() -> None:
    # Linux: SIGKILL this worker when the trainer dies, even if a call is stuck. (The
    # signal follows the trainer thread that started the worker: the main thread or the
    # async producer's, both alive for the whole run.)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def _dispatch(envs: dict[int, Any], op: str, key: int, args: tuple) -> Any:
    if op == "open":
        env_id, factory, kwargs = args
        envs[key] = build_env(env_id, _loads(factory), kwargs)
        return None
    if op == "reset":
        task, seed = args
        return await envs[key].reset(task, seed=seed)
    if op == "step":
        return await envs[key].step(args[0])
    if op == "close":
        env = envs.pop(key, None)
        if env is not None:
            await env.close()
        return None
    if op == "grade":
        recipe, rollout, task = args
        if recipe not in _graders:  # built once per worker, kept (graders keep pools warm)
            _graders[recipe] = _loads(recipe)()
        return await _graders[recipe].grade(rollout, task)
    raise ValueError(f"unknown env worker op {op!r}")


_graders: dict[bytes, Any] = {}  # graders built in this worker, by their pickled recipe


def env_default_grader(env_id: str, factory: Callable[..., Any], kwargs: dict) -> Any:
    """A grader recipe: the default grader of an environment (built in the worker)."""
    return build_env(env_id, factory, kwargs).default_grader()


def spec_grader(spec: Any) -> Any:
    """A grader recipe: a grader spec (`rldojo.graders.load`), built in the worker."""
    from rldojo.graders import load

    return load(spec)


@types.coroutine
def _tracked(coro: Any, rid: int, running: RunningCall) -> Any:
    """Drive `coro`, noting in `running` whose code is on the CPU right now, so the reader
    thread can tell which call a blocked event loop is stuck in (and the trainer, which
    call a crash happened in)."""
    value, error = None, None
    while True:
        running.set(rid)
        try:
            yielded = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as stop:
            return stop.value
        finally:
            running.set(-1)
        try:
            value, error = (yield yielded), None
        except BaseException as exc:  # cancellation and errors go into the coroutine
            value, error = None, exc


def _serve(conn: Any, running: RunningCall) -> None:
    """Worker main. Calls `(rid, op, key, args)` run as tasks on the event loop; the reader
    thread answers `who` (which call is running, also while the loop is blocked) and
    `cancel` itself."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    sys.path[:] = conn.recv()  # the trainer's import path: its factories' modules resolve
    loop = asyncio.new_event_loop()
    envs: dict[int, Any] = {}
    tasks: dict[int, asyncio.Task] = {}  # also the strong references to running calls
    sending = threading.Lock()  # the loop thread and the reader thread both answer

    def send(reply: tuple) -> None:
        with sending:
            conn.send(reply)

    async def handle(rid: int, op: str, key: int, args: tuple) -> None:
        try:
            result = await _tracked(_dispatch(envs, op, key, args), rid, running)
            reply: tuple = (rid, True, result)
        except Exception as exc:
            reply = (rid, False, f"{type(exc).__name__}: {exc}")
        finally:
            tasks.pop(rid, None)
        try:
            send(reply)
        except Exception as exc:  # e.g. an unpicklable observation
            send((rid, False, f"cannot send the result of {op}: {exc}"))

    def start(rid: int, op: str, key: int, args: tuple) -> None:
        tasks[rid] = loop.create_task(handle(rid, op, key, args))

    def read() -> None:
        try:
            while True:
                rid, op, key, args = conn.recv()
                if op == "who":
                    now = running.get()
                    send((rid, True, None if now < 0 else now))
                elif op == "cancel":
                    task = tasks.get(args[0])
                    if task is not None:
                        loop.call_soon_threadsafe(task.cancel)
                else:
                    loop.call_soon_threadsafe(start, rid, op, key, args)
        except (EOFError, OSError):
            loop.call_soon_threadsafe(loop.stop)

    threading.Thread(target=read, daemon=True).start()
    send((READY, True, os.getpid()))  # serving now: calls' timeouts start (trainer side)
    loop.run_forever()
    os._exit(0)  # a stuck environment thread must not keep the worker alive


def _loads(blob: bytes) -> Callable[..., Any]:
    return pickle.loads(blob)  # type: ignore[no-any-return]


if __name__ == "__main__":  # a worker: `python -m rldojo.rollout.env_worker FD MEM`
    _serve(Connection(int(sys.argv[1])), RunningCall(int(sys.argv[2])))
