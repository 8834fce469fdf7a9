"""The worker process itself: `main([FD, MEM, PARENT_PID, DIE])` in a fresh interpreter.

`rldojo.workers.process.WorkerProcess` starts it and is its parent side. The child gets the
parent's ``sys.path``, runs an optional initializer, says `(READY, True, pid)` (or
`(READY, False, error)` when the initializer failed, then exits) and serves calls until
its socket closes. Each call `(rid, "call", pickled (fn, args, kwargs))` runs as a task on
the child's event loop, in the order received: a plain function runs at once (holding the
loop, as blocking code does; with no running loop visible, so it may call `asyncio.run`),
a coroutine function's coroutine runs on the loop, so async calls share the worker. When
a call's task begins it says `(STARTED, True, rid)` (its timeout counts from then, not
from its wait behind other calls). Replies are `(rid, True, result)` or `(rid, False,
(type, message, traceback))`. A reader thread answers `who` (which call's code is on the
CPU now, also while the loop is blocked) and `cancel`.

The running call's id also lives in 8 shared bytes (MEM, `RunningCall`): after the child
dies, the parent reads whose code was running, so it blames that call and not its
neighbours. The child exits when the parent goes away (checked every second, and on
Linux with DIE=1 also through `PR_SET_PDEATHSIG`, which works while a call holds the GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import pickle
import signal
import struct
import sys
import threading
import time
import traceback
import types
from collections.abc import Coroutine, Generator, Iterator
from multiprocessing.connection import Connection
from typing import Any

READY = -1
"""The request id of the child's first message (request ids are >= 0)."""

STARTED = -2
"""The request id of a message saying that call `payload` has begun running."""

_PARENT_POLL_S = 1.0
"""How often the child checks that its parent is still alive."""

ErrorInfo = tuple[str, str, str]
"""What a failure in the child sends back: exception type name, message, traceback."""


class RunningCall:
    """Which request's code runs in the child now (-1: none): 8 bytes of memory shared by
    child and parent, so after a crash the parent knows whose call caused it."""

    def __init__(self, fd: int) -> None:
        self._mem = mmap.mmap(fd, 8)

    def set(self, rid: int) -> None:
        struct.pack_into("q", self._mem, 0, rid)

    def get(self) -> int:
        return int(struct.unpack_from("q", self._mem, 0)[0])


def error_info(exc: BaseException, prefix: str = "") -> ErrorInfo:
    """An exception as the child reports it."""
    tb = "".join(traceback.format_exception(exc))
    return (type(exc).__name__, f"{prefix}{exc}", tb)


def _die_with_parent() -> None:
    # Linux: SIGKILL this child when the thread that started it dies, even if a call is
    # stuck holding the GIL (the poll below cannot run then). Only for parents whose
    # starting thread lives as long as the parent (the caller decides: DIE=1).
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent is gone, even while a call is still running."""
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(0)


@contextlib.contextmanager
def _no_running_loop() -> Iterator[None]:
    """Hide the child's event loop from a plain function, as if it ran in a plain thread
    (then it may call `asyncio.run` itself)."""
    loop = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(loop)


@types.coroutine
def _tracked(
    steps: Coroutine[object, object, object], rid: int, running: RunningCall
) -> Generator[object, object, object]:
    """Drive an awaitable's steps, noting in `running` whose code is on the CPU right now,
    so the reader thread can tell which call a blocked event loop is stuck in (and the
    parent, which call a crash happened in)."""
    value, error = None, None
    while True:
        running.set(rid)
        try:
            yielded = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value
        finally:
            running.set(-1)
        try:
            value, error = (yield yielded), None
        except BaseException as exc:  # cancellation and errors go into the awaitable
            value, error = None, exc


async def _run(blob: bytes, rid: int, running: RunningCall) -> Any:
    running.set(rid)  # unpickling imports the caller's modules: blame it on this call
    try:
        fn, args, kwargs = pickle.loads(blob)
        with _no_running_loop():
            result = fn(*args, **kwargs)
    finally:
        running.set(-1)
    if hasattr(result, "__await__"):  # a coroutine function's coroutine: run it here
        result = await _tracked(result.__await__(), rid, running)
    return result


def _start(conn: Connection) -> bool:
    """Take the parent's import path, run the initializer; False when it failed."""
    sys.path[:] = conn.recv()  # before unpickling anything that names a module
    try:
        initializer, initargs = pickle.loads(conn.recv_bytes())
        if initializer is not None:
            initializer(*initargs)
    except (EOFError, OSError):
        raise
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures too
        conn.send((READY, False, error_info(exc)))
        return False
    conn.send((READY, True, os.getpid()))  # serving now: calls' timeouts start
    return True


def serve(conn: Connection, running: RunningCall) -> None:
    """Serve calls on `conn` until it closes."""
    loop = asyncio.new_event_loop()
    tasks: dict[int, asyncio.Task[None]] = {}  # also the strong references to running calls
    sending = threading.Lock()  # the loop thread and the reader thread both answer

    def send(reply: tuple[Any, ...]) -> None:
        with sending:
            conn.send(reply)

    async def handle(rid: int, blob: bytes) -> None:
        running.set(rid)  # from its clock's start on, the loop is this call's (`_run`)
        with contextlib.suppress(OSError):  # the parent is gone: the reader stops the loop
            send((STARTED, True, rid))
        try:
            reply: tuple[Any, ...] = (rid, True, await _run(blob, rid, running))
        except BaseException as exc:  # SystemExit, a cancel from the parent: replies too
            reply = (rid, False, error_info(exc))
        finally:
            tasks.pop(rid, None)
        try:
            send(reply)
        except Exception as exc:  # e.g. an unpicklable result
            send((rid, False, error_info(exc, "cannot send the result: ")))

    def start(rid: int, blob: bytes) -> None:
        tasks[rid] = loop.create_task(handle(rid, blob))

    def read() -> None:
        try:
            while True:
                rid, op, payload = conn.recv()
                if op == "who":
                    now = running.get()
                    send((rid, True, None if now < 0 else now))
                elif op == "cancel":
                    task = tasks.get(payload)
                    if task is not None:
                        loop.call_soon_threadsafe(task.cancel)
                else:
                    loop.call_soon_threadsafe(start, rid, payload)
        except (EOFError, OSError):
            pass
        loop.call_soon_threadsafe(loop.stop)

    threading.Thread(target=read, name="rldojo-worker-reader", daemon=True).start()
    loop.run_forever()


def main(argv: list[str]) -> None:
    fd, mem, parent_pid, die = map(int, argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if die:
        _die_with_parent()
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    conn = Connection(fd)
    try:
        if _start(conn):
            serve(conn, RunningCall(mem))
    except (EOFError, OSError):
        pass  # the parent hung up
    os._exit(0)  # a stuck thread of a call must not keep the worker alive


if __name__ == "__main__":
    main(sys.argv[1:])
