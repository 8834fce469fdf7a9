"""`WorkerProcess`: the parent's handle on one worker process (`rldojo.workers.child`).

A worker is a fresh interpreter (`python -c` of `child.main`), not a fork or
multiprocessing's spawn: nothing of the parent's threads or locks is copied (it may run
torch), and the user's ``__main__`` is never re-run, so functions must be picklable by
plain pickle (top-level functions of importable modules; pre-pickle anything else with
cloudpickle and pass the bytes). It runs in its own process group, so killing it kills what
it started too.

`call(fn, args, kwargs, timeout_s=...)` sends a call and awaits its reply on the caller's
event loop (calls may come from several loops in several threads: a reader thread wakes
each on its own loop). Outcomes:

- `fn` returns: its result; `fn` raises: `CallError` (type, message, traceback) and the
  worker stays alive and warm;
- past `timeout_s` (counted from when the worker serves calls; its start-up is bounded by
  `start_timeout_s`, then `WorkerStartTimeout`): if this call holds the worker's event
  loop (blocking code, C), or the worker does not even answer, the worker is killed; if
  the loop is free (an `await` that never returns), the call is cancelled in the worker;
  if another call holds the loop, this one waits for that one's fate, one more
  `timeout_s` at most. Either way `CallTimeout`;
- the worker dies (crash, `os._exit`, OOM kill, `kill -9`, or killed for another call's
  timeout): `WorkerDied`, whose `culprit` says whether this call's code was running
  (read from memory shared with the child) or the cause is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rldojo.workers.child import READY, ErrorInfo, RunningCall
from rldojo.workers.outcomes import (
    CallError,
    CallTimeout,
    Counters,
    WorkerDied,
    WorkerStartTimeout,
    describe_exit,
)
from rldojo.workers.spawn import shared_fd, spawn

log = logging.getLogger("rldojo.workers")

_Waiter = tuple["asyncio.Future[Any]", asyncio.AbstractEventLoop]


def _wake(waiter: _Waiter, value: Any, error: BaseException | None) -> None:
    fut, loop = waiter

    def settle() -> None:
        if fut.done():  # cancelled by a timeout meanwhile
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle)


class WorkerProcess:
    """One worker process, its socket, and the calls waiting on it (see the module doc).

    Args:
        name: says which worker in messages, logs and the reader thread's name.
        init_blob: ``pickle.dumps((initializer, initargs))``, run once in the child.
        start_timeout_s: how long the child may take to start serving calls.
        die_with_parent: also `PR_SET_PDEATHSIG` (Linux): the child dies with the thread
            that started it, even while a call holds the GIL. Only for parents whose
            starting thread lives as long as they do.
        counters: where to count what happens (a pool shares one among its workers).
        output: a file the child's stdout and stderr are appended to (None: the parent's;
            `rldojo.workers.spawn`).
    """

    _ids = itertools.count()  # request ids, unique in this parent

    def __init__(
        self, name: str, *, init_blob: bytes = pickle.dumps((None, ())),
        start_timeout_s: float = 120.0, die_with_parent: bool = False,
        counters: Counters | None = None, output: str | os.PathLike[str] | None = None,
    ) -> None:  # fmt: skip
        self.name, self.start_timeout_s = name, start_timeout_s
        self.counters = counters if counters is not None else Counters()
        mine, theirs = socket.socketpair()
        mem = shared_fd()
        try:
            self.running = RunningCall(mem)
            self.running.set(-1)
            self.process = spawn(theirs.fileno(), mem, die_with_parent, output)
        finally:
            theirs.close()  # so that the child's death reads as EOF here
            os.close(mem)  # the mapping stays
        self.counters.started += 1
        self.conn = Connection(mine.detach())
        with contextlib.suppress(OSError):  # a child that died at once: the reader says so
            self.conn.send(list(sys.path))
            self.conn.send_bytes(init_blob)
        self.residents = 0  # stateful things its users placed on it (e.g. environments)
        self.in_flight = 0  # calls waiting on it
        self.alive = True  # False once the reader saw it go
        self.ready = False  # it has said READY: it serves calls
        self.init_error: ErrorInfo | None = None
        self.how = ""  # how it ended, once it has
        self._closing = False
        self._pending: dict[int, _Waiter] = {}
        self._ready_waiters: list[_Waiter] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # calls come from several event loops' threads
        self._gone = threading.Event()  # the reader reaped the child and woke its calls
        threading.Thread(target=self._read, name=f"{name}-reader", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.alive and self.process.poll() is None

    def load(self) -> int:
        """How busy it is, for placing new work: residents plus calls in flight."""
        return self.residents + self.in_flight

    # ------------------------------------------------------------------ calls

    async def call(
        self, fn: Callable[..., Any], args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None, *, timeout_s: float | None,
        label: str = "call",
    ) -> Any:  # fmt: skip
        """Run `fn(*args, **kwargs)` in the worker; see the module docstring for outcomes.
        `label` names the call in timeout messages (`{label} took longer than 5s`)."""
        rid, fut = self._submit("call", pickle.dumps((fn, args, kwargs or {})))
        self.in_flight += 1
        try:
            return await self._wait(rid, fut, timeout_s, label)
        finally:
            self.in_flight -= 1

    def _submit(
        self, op: str, payload: Any, *, reply: bool = True
    ) -> tuple[int, asyncio.Future[Any]]:
        """Send a request; its reply (if `reply`) settles the returned future."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if not self.alive:
                raise WorkerDied(f"{self.name} (pid {self.pid}) is gone", sent=False)
            rid = next(self._ids)
            if reply:
                self._pending[rid] = (fut, loop)
        try:
            with self._send_lock:
                self.conn.send((rid, op, payload))
        except (OSError, ValueError) as exc:  # the socket broke: the worker is gone
            self._forget(rid)
            raise WorkerDied(f"{self.name} (pid {self.pid}): {exc}", sent=False) from None
        return rid, fut

    def _forget(self, rid: int) -> None:
        with self._lock:
            self._pending.pop(rid, None)

    async def _wait(
        self, rid: int, fut: asyncio.Future[Any], timeout_s: float | None, label: str
    ) -> Any:
        loop = asyncio.get_running_loop()
        killed = False
        try:
            if not await self._started(fut):
                self._forget(rid)
                self.kill(f"it did not start within {self.start_timeout_s:g}s")
                raise WorkerStartTimeout(
                    f"{self.name} did not start within {self.start_timeout_s:g}s"
                )
            if timeout_s is None:
                return await fut
            deadline = loop.time() + timeout_s  # from the start of the worker, not before
            hard = deadline + timeout_s
            while True:
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), deadline - loop.time())
                except TimeoutError:
                    pass
                blocker = rid if self.running.get() == rid else await self._who_runs()
                if blocker == "dead":  # killed meanwhile (another call's timeout)
                    return await fut
                if blocker == rid or blocker == "unknown" or loop.time() >= hard:
                    self._forget(rid)
                    self.kill(f"{label} held the worker for {timeout_s:g}s")
                    killed = True
                    await self._until_gone()
                    break
                if blocker is None:  # the loop is free: this call waits on nothing
                    self._forget(rid)
                    with contextlib.suppress(WorkerDied):
                        self._submit("cancel", rid, reply=False)
                    break
                deadline = min(hard, loop.time() + 0.2)  # someone else blocks the loop
        finally:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" noise for a dead worker
        self.counters.timeouts += 1
        raise CallTimeout(f"{label} took longer than {timeout_s:g}s", killed=killed)

    async def _started(self, fut: asyncio.Future[Any]) -> bool:
        """Wait until the worker serves calls, or `fut` (a call on it) is settled; False
        when neither happened within `start_timeout_s`."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.ready or not self.alive:
                return True
            ready = loop.create_future()
            self._ready_waiters.append((ready, loop))
        done, _ = await asyncio.wait({ready, fut}, timeout=self.start_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        ready.cancel()  # if still pending: a later wake finds it done and leaves it
        return bool(done)

    async def _who_runs(self) -> int | str | None:
        """The request whose code is running in the worker now (None: none), `unknown`
        when the worker does not answer (stuck holding the GIL), `dead` when it is gone."""
        try:
            rid, fut = self._submit("who", None)
        except WorkerDied:
            return "dead"
        try:
            return await asyncio.wait_for(fut, 1.0)  # type: ignore[no-any-return]
        except WorkerDied:
            return "dead"
        except TimeoutError:
            self._forget(rid)
            return "unknown"

    async def _until_gone(self, timeout_s: float = 30.0) -> None:
        """Wait (without blocking the loop) until the reader has reaped the child."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while not self._gone.is_set() and loop.time() < end:
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------- the reader

    def _read(self) -> None:
        try:
            while True:
                rid, ok, payload = self.conn.recv()
                if rid == READY:
                    self._on_ready(ok, payload)
                    continue
                with self._lock:
                    waiter = self._pending.pop(rid, None)
                if waiter is not None:
                    _wake(waiter, payload, None if ok else CallError(*payload))
        except (EOFError, OSError):
            pass
        except Exception:  # a reply that does not unpickle here: the worker is unusable
            log.exception("%s sent a reply that cannot be read; killing it", self.name)
            self.kill("its reply could not be read")
        self._on_death()

    def _on_ready(self, ok: bool, payload: Any) -> None:
        if not ok:
            self.init_error = payload  # the child exits now: its death wakes the calls
            return
        with self._lock:
            self.ready = True
            waiters, self._ready_waiters = self._ready_waiters, []
        for waiter in waiters:
            _wake(waiter, None, None)

    def _on_death(self) -> None:
        self.how = self._reap()
        culprit = self.running.get()
        if not self._closing:
            self.counters.died += 1
        why = f"{self.name} (pid {self.pid}) {self.how}"
        if self.init_error is not None:
            why = f"{why}: its initializer failed: {self.init_error[0]}: {self.init_error[1]}"
        with self._lock:
            self.alive = False
            waiting, self._pending = self._pending, {}
            ready_waiters, self._ready_waiters = self._ready_waiters, []
        for rid, waiter in waiting.items():  # unknown cause (-1): everyone is suspect
            error = WorkerDied(why, culprit=culprit in (rid, -1), how=self.how,
                               init_error=self.init_error)  # fmt: skip
            _wake(waiter, None, error)
        for waiter in ready_waiters:  # who waits for the start-up learns from its call
            _wake(waiter, None, None)
        with self._send_lock:
            self.conn.close()
        self._gone.set()

    def _reap(self) -> str:
        """Collect the child that closed its socket; say how it ended."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2.0)  # it is exiting: its own exit status wins
        self._kill_group()  # leftovers it started (and the child, if it hangs on exit)
        self.process.wait()
        return describe_exit(self.process.returncode)

    # -------------------------------------------------------------- stopping

    def _kill_group(self) -> None:
        """SIGKILL the child's process group: the child and anything it started. (The
        group id stays reserved while any member lives; an empty group is simply gone.)"""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    def kill(self, why: str) -> None:
        """SIGKILL the worker (and what it started); its calls get `WorkerDied`."""
        if self.process.poll() is None:
            log.warning("killing %s (pid %s): %s", self.name, self.pid, why)
            self.counters.killed += 1
            self._kill_group()

    def terminate(self) -> None:
        """SIGTERM the worker alone, not what it started: a request to stop at its next
        safe point (its function may handle it; else it dies and its calls get
        `WorkerDied`). What it started keeps serving it until it exits."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def kill_and_wait(self, why: str, timeout_s: float = 30.0) -> None:
        """`kill`, then wait until the child is reaped and its calls are woken."""
        self.kill(why)
        self._gone.wait(timeout_s)

    def hang_up(self) -> None:
        """Shut the socket down (wakes our reader thread too); the worker sees EOF, exits."""
        self._closing = True
        try:
            sock = socket.socket(fileno=self.conn.fileno())
            sock.shutdown(socket.SHUT_RDWR)
            sock.detach()
        except (OSError, ValueError):
            pass

    def close(self, grace_s: float = 2.0) -> None:
        """Hang up, give the worker `grace_s` to exit, then SIGKILL it; reaped either way."""
        self.hang_up()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        self._kill_group()
        self.process.wait()
        self._gone.wait(10.0)
