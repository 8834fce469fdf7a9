"""Hard-timeout process isolation for code that may hang or crash (math parsing, user graders).

`IsolatedWorker` keeps one long-lived child process and runs picklable top-level functions
in it; `IsolatedPool` (`rldojo.workers.isolation_pool`) keeps up to `size` such workers
for concurrent callers. Both are awaited from asyncio:

    pool = IsolatedPool(size=2, initializer=warm_up)
    result = await pool.call(fn, *args, timeout_s=5.0)

Outcomes of a call:
    * the function returns        -> its return value
    * it raises                   -> `RemoteError` (the child stays alive and warm)
    * it runs past `timeout_s`    -> the child is SIGKILLed, `IsolationTimeout` is raised,
                                     and a fresh child is started in the background
    * the child dies (segfault,   -> `IsolationCrash`; a fresh child is started, so the
      os._exit, OOM killer)          next call works

The children are `rldojo.workers` processes: fresh interpreters (not forks: no inherited
threads or locks, so the parent may run torch or any other threaded library; the
parent's ``__main__`` is never re-run in the child, so functions must live in an
importable module), each in its own process group (a timeout kills what the function
started too). The child gets the parent's ``sys.path``. Workers stay alive across calls
because the first import of a library such as math-verify is slow; pass `initializer` to
do that import before the first call.
The time a child takes to start (bounded by `start_timeout_s`) is not counted against
`timeout_s`.

The workers are not bound to one event loop. `IsolatedPool` (in `isolation_pool`) keeps
several for concurrent callers, also from event loops in different threads.
`close()` stops every child; children also exit on their own when the parent's end of
their socket closes or the parent process disappears.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from rldojo.workers import (
    CallError,
    CallTimeout,
    WorkerDied,
    WorkerPool,
    WorkerProcess,
    WorkerStartTimeout,
)

T = TypeVar("T")

__all__ = [
    "IsolatedWorker",
    "IsolationCrash",
    "IsolationError",
    "IsolationTimeout",
    "RemoteError",
]


class IsolationError(Exception):
    """Base class of the errors an isolated call raises."""


class IsolationTimeout(IsolationError):
    """The function ran past its timeout; its child process was killed."""


class IsolationCrash(IsolationError):
    """The child process died (signal, `os._exit`, failed start) during the call."""


class RemoteError(IsolationError):
    """The function raised in the child. `exc_type` and `remote_traceback` say what and where."""

    def __init__(self, exc_type: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{exc_type}: {message}" if message else exc_type)
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback


class IsolatedWorker:
    """One long-lived child process that runs one call at a time with a hard timeout.

    A one-slot `rldojo.workers.WorkerPool`: after a timeout or a crash the replacement
    starts at once, so it is warm by the next call.

    Args:
        initializer: picklable top-level function run once in each new child (e.g. an
            import that is slow the first time).
        initargs: arguments for `initializer`.
        start_timeout_s: how long a new child may take to become ready.
    """

    def __init__(
        self,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        start_timeout_s: float = 60.0,
    ) -> None:
        self._pool = WorkerPool(
            1,
            name="isolated worker",
            initializer=initializer,
            initargs=initargs,
            start_timeout_s=start_timeout_s,
        )
        self._busy = False

    @property
    def pid(self) -> int | None:
        """The pid of the current child, or None when none is running."""
        pids = self._pool.pids
        return pids[0] if pids else None

    def start(self) -> None:
        """Start the child now (it warms up in the background); a no-op when one runs."""
        if self._pool.closed:
            raise RuntimeError("IsolatedWorker is closed")
        self._pool.start()

    async def call(
        self, fn: Callable[..., T], *args: object, timeout_s: float, **kwargs: object
    ) -> T:
        """Run `fn(*args, **kwargs)` in the child; see the module docstring for outcomes."""
        if self._busy:
            raise RuntimeError("IsolatedWorker runs one call at a time; use IsolatedPool")
        self._busy = True
        try:
            try:
                return await self._call(fn, args, kwargs, timeout_s)
            except WorkerDied:  # the idle child died since the last call (nothing of
                pass  # ours ran): retry once
            try:
                return await self._call(fn, args, kwargs, timeout_s)
            except WorkerDied as exc:
                raise IsolationCrash(f"worker process died before the call: {exc}") from None
        finally:
            self._busy = False

    async def _call(
        self,
        fn: Callable[..., T],
        args: tuple[object, ...],
        kwargs: dict[str, object],
        timeout_s: float,
    ) -> T:
        if self._pool.closed:
            raise RuntimeError("IsolatedWorker is closed")
        worker = self._pool.slot(0)
        try:
            result: T = await worker.call(fn, args, kwargs, timeout_s=timeout_s)  # unpickled
            return result
        except asyncio.CancelledError:
            self._restart(worker)  # the child is still busy with the abandoned call
            raise
        except CallError as exc:
            first = exc.message.splitlines()[0] if exc.message else ""
            raise RemoteError(exc.exc_type, first, exc.remote_traceback) from None
        except CallTimeout:
            self._restart(worker)
            raise IsolationTimeout(
                f"call did not finish within {timeout_s:g}s; worker killed"
            ) from None
        except WorkerStartTimeout:
            raise IsolationCrash(
                f"worker did not start within {worker.start_timeout_s:g}s"
            ) from None
        except WorkerDied as exc:
            if not exc.sent:
                raise  # `call` retries it
            if exc.init_error is not None:
                kind, message, _ = exc.init_error
                raise IsolationCrash(f"worker initializer failed: {kind}: {message}") from None
            self._restart(worker)
            raise IsolationCrash(f"worker process {exc.how} during the call") from exc

    def _restart(self, worker: WorkerProcess) -> None:
        """Kill the child and start a fresh one that warms up while we wait."""
        self._pool.restart(worker, "its call timed out or was abandoned")

    def close(self) -> None:
        """Stop the child: ask politely, then SIGKILL. Idempotent."""
        self._pool.close(grace_s=0.0 if self._busy else 1.0)

    def __enter__(self) -> IsolatedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
