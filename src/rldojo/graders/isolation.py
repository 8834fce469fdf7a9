"""Hard-timeout process isolation for code that may hang or crash (math parsing, user graders).

`IsolatedWorker` keeps one long-lived child process and runs picklable top-level functions
in it; `IsolatedPool` (`rldojo.graders.isolation_pool`) keeps up to `size` such workers
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

Each child is a fresh interpreter (`subprocess.Popen` of ``sys.executable``, which
execs at once: no inherited threads or locks), so the parent may run torch or any other
threaded library. Unlike multiprocessing's "spawn", the parent's ``__main__`` is never
re-run in the child, so functions must live in an importable module (not ``__main__``);
the child gets the parent's ``sys.path``. Workers stay alive across calls because the
first import of a library such as math-verify is slow; pass `initializer` to do that
import before the first call.
The time a child takes to start (bounded by `start_timeout_s`) is not counted against
`timeout_s`.

The workers are not bound to one event loop. `IsolatedPool` (in `isolation_pool`) keeps
several for concurrent callers, also from event loops in different threads.
`close()` stops every child; children also exit on their own when the parent's end of
their pipe closes or the parent process disappears.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing.connection
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "IsolatedWorker",
    "IsolationCrash",
    "IsolationError",
    "IsolationTimeout",
    "RemoteError",
]

_PARENT_POLL_S = 1.0
"""How often an idle or busy child checks that its parent is still alive."""


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


# --------------------------------------------------------------------------- child side


def _watch_parent(parent_pid: int) -> None:
    """Exit the child when its parent is gone, even while a call is still running."""
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(0)


def _error_reply(exc: BaseException) -> tuple[str, str, str, str]:
    text = str(exc)
    tb = "".join(traceback.format_exception(exc))
    return ("raised", type(exc).__name__, text.splitlines()[0] if text else "", tb)


def _child_entry(fd: int, parent_pid: int) -> None:
    """Entry point of the child interpreter: serve calls until the parent says stop or leaves.

    Protocol on the socket: parent -> child ``sys.path``, then ``(initializer, initargs)``;
    child -> parent ``("ready", pid)`` or ``("init_failed", type, message, traceback)``;
    then ``(fn, args, kwargs)`` -> ``("ok", result)`` or ``("raised", type, message,
    traceback)`` per call; ``None`` from the parent ends the child.
    """
    # Ctrl-C reaches the whole process group; the parent decides what happens to us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    conn = multiprocessing.connection.Connection(fd)
    try:
        sys.path[:] = conn.recv()  # before unpickling anything that names a module
        initializer, initargs = conn.recv()
        if initializer is not None:
            initializer(*initargs)
    except (EOFError, OSError):
        return
    except BaseException as exc:
        conn.send(("init_failed", *_error_reply(exc)[1:]))
        return
    conn.send(("ready", os.getpid()))
    _serve(conn)


def _serve(conn: multiprocessing.connection.Connection) -> None:
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        except BaseException as exc:  # the request did not unpickle (e.g. unknown module)
            conn.send(_error_reply(exc))
            continue
        if request is None:
            return
        fn, args, kwargs = request
        try:
            reply: tuple[Any, ...] = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # SystemExit and KeyboardInterrupt are errors too
            reply = _error_reply(exc)
        try:
            conn.send(reply)
        except Exception as exc:  # the result did not pickle
            conn.send(_error_reply(exc))


# -------------------------------------------------------------------------- parent side


async def _wait_readable(conn: multiprocessing.connection.Connection, timeout_s: float) -> bool:
    """Wait until `conn` has data or EOF, without blocking the event loop. False on timeout."""
    if conn.poll(0):
        return True
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = conn.fileno()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait_for(ready, timeout_s)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


_CHILD_CODE = (
    "import sys; from rldojo.graders.isolation import _child_entry; "
    "_child_entry(*map(int, sys.argv[1:]))"
)


def _child_environ() -> dict[str, str]:
    """The parent's environment, with rldojo's own location on PYTHONPATH.

    The child must import this module before it receives the parent's ``sys.path``;
    that works even when rldojo was put on ``sys.path`` at run time, not installed.
    """
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # .../src, the folder holding rldojo/
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, root])
    return env


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group: the child and anything it started.

    The group id stays reserved while any member lives, so this is safe after the child
    itself was reaped; an empty group is simply gone.
    """
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


class IsolatedWorker:
    """One long-lived child process that runs one call at a time with a hard timeout.

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
        try:  # fail here, not in a half-started child
            pickle.dumps((initializer, initargs))
        except Exception as exc:
            raise TypeError(f"initializer and initargs must be picklable: {exc}") from exc
        self._initializer = initializer
        self._initargs = initargs
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._ready = False
        self._busy = False
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The pid of the current child, or None when none is running."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the child now (it warms up in the background); a no-op when one runs."""
        if self._closed:
            raise RuntimeError("IsolatedWorker is closed")
        if self._process is not None:
            return
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_CODE, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                env=_child_environ(),
                start_new_session=True,  # own process group: killed with its children
            )
        finally:
            theirs.close()  # so that the child's death reads as EOF here
        conn = multiprocessing.connection.Connection(ours.detach())
        self._process, self._conn, self._ready = process, conn, False
        try:
            conn.send(list(sys.path))
            conn.send((self._initializer, self._initargs))
        except OSError:
            pass  # the child already died; `_ensure_ready` reports it

    async def call(self, fn: Callable[..., T], *args: Any, timeout_s: float, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` in the child; see the module docstring for outcomes."""
        if self._busy:
            raise RuntimeError("IsolatedWorker runs one call at a time; use IsolatedPool")
        self._busy = True
        try:
            conn = await self._ensure_ready()
            try:
                conn.send((fn, args, kwargs))
            except (BrokenPipeError, ConnectionResetError):
                # The idle child died since the last call (nothing of ours ran): retry once.
                self._kill()
                conn = await self._ensure_ready()
                conn.send((fn, args, kwargs))
            return await self._receive(conn, timeout_s)  # type: ignore[no-any-return]
        finally:
            self._busy = False

    async def _receive(self, conn: multiprocessing.connection.Connection, timeout_s: float) -> Any:
        try:
            readable = await _wait_readable(conn, timeout_s)
        except asyncio.CancelledError:
            self._restart()  # the child is still busy with the abandoned call
            raise
        if not readable:
            self._restart()
            raise IsolationTimeout(f"call did not finish within {timeout_s:g}s; worker killed")
        try:
            reply = conn.recv()
        except (EOFError, OSError) as exc:
            how = self._reap()
            self._restart()
            raise IsolationCrash(f"worker process {how} during the call") from exc
        if reply[0] == "ok":
            return reply[1]
        raise RemoteError(reply[1], reply[2], reply[3])

    async def _ensure_ready(self) -> multiprocessing.connection.Connection:
        if self._process is None:
            self.start()
        conn = self._conn
        assert conn is not None
        if self._ready:
            return conn
        if not await _wait_readable(conn, self._start_timeout_s):
            self._kill()
            raise IsolationCrash(f"worker did not start within {self._start_timeout_s:g}s")
        try:
            reply = conn.recv()
        except (EOFError, OSError) as exc:
            how = self._reap()
            raise IsolationCrash(f"worker process {how} while starting") from exc
        if reply[0] != "ready":
            self._kill()
            raise IsolationCrash(f"worker initializer failed: {reply[1]}: {reply[2]}")
        self._ready = True
        return conn

    def _reap(self) -> str:
        """Collect a child that is gone (or going); say how it ended."""
        process = self._process
        if process is None:
            return "was not running"
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)  # the child is exiting: its own exit status wins
        _kill_group(process)  # leftovers it started (and the child, if it hangs on exit)
        process.wait()
        how = _describe_exit(process.returncode)
        self._forget()
        return how

    def _kill(self) -> None:
        """SIGKILL the child (if any) and wait for it, so no zombie is left."""
        process = self._process
        if process is not None:
            _kill_group(process)
            process.wait()
        self._forget()

    def _restart(self) -> None:
        """Kill the current child and start a fresh one that warms up while we wait."""
        self._kill()
        if not self._closed:
            self.start()

    def _forget(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn, self._ready = None, None, False

    def close(self) -> None:
        """Stop the child: ask politely, then SIGKILL. Idempotent."""
        self._closed = True
        process, conn = self._process, self._conn
        if process is None or conn is None:
            return
        if self._ready and not self._busy:
            with contextlib.suppress(OSError):
                conn.send(None)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1.0)
        self._kill()

    def __enter__(self) -> IsolatedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
