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
- past `timeout_s`, counted from when the worker begins running this call (the worker
  says so), so neither the worker's start-up (bounded by `start_timeout_s`, then
  `WorkerStartTimeout`) nor the call's wait behind other calls counts: if this call
  holds the worker's event loop (blocking code, C), or the worker does not even answer,
  the worker is killed; if the loop is free (an `await` that never returns), the call is
  cancelled in the worker; if another call holds the loop, this one waits for that one's
  fate, until that call's deadline plus `timeout_s` at most. Either way `CallTimeout`;
- a call waiting its turn behind one that holds the loop is not charged: when that one's
  timeout kills the worker, it gets `WorkerDied`, not its fault. Its wait is bounded by
  that call's deadline plus its own `timeout_s`, and by the worker's progress: a worker
  that begins no call for `timeout_s` (and runs none with a deadline) is stuck and
  killed (`rldojo.workers.deadlines`);
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
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rldojo.workers.child import READY, STARTED, ErrorInfo, RunningCall
from rldojo.workers.deadlines import enforce, wait_turn
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


def _wake(waiter: _Waiter, value: object, error: BaseException | None) -> None:
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
        self,
        name: str,
        *,
        init_blob: bytes = pickle.dumps((None, ())),
        start_timeout_s: float = 120.0,
        die_with_parent: bool = False,
        counters: Counters | None = None,
        output: str | os.PathLike[str] | None = None,
    ) -> None:
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
        self._killed = False
        self._pending: dict[int, _Waiter] = {}
        self._starting: dict[int, _Waiter] = {}  # calls sent, not yet begun in the worker
        self.deadlines: dict[int, float] = {}  # begun calls' deadlines (time.monotonic)
        self.begun = 0  # calls it has begun: a call waiting its turn sees the queue move
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
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float | None,
        label: str = "call",
    ) -> Any:
        """Run `fn(*args, **kwargs)` in the worker; see the module docstring for outcomes.
        `label` names the call in timeout messages (`{label} took longer than 5s`)."""
        begun = asyncio.get_running_loop().create_future()
        rid, fut = self._submit("call", pickle.dumps((fn, args, kwargs or {})), begun=begun)
        self.in_flight += 1
        try:
            return await self._wait(rid, fut, begun, timeout_s, label)
        finally:
            self.in_flight -= 1
            self.forget(rid, reply=False)
            self.deadlines.pop(rid, None)  # kept until now: calls behind it wait its fate

    def _submit(
        self,
        op: str,
        payload: object,
        *,
        reply: bool = True,
        begun: asyncio.Future[Any] | None = None,
    ) -> tuple[int, asyncio.Future[Any]]:
        """Send a request; its reply (if `reply`) settles the returned future, the worker's
        word that it began running it settles `begun`."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if not self.alive:
                raise WorkerDied(f"{self.name} (pid {self.pid}) is gone", sent=False)
            rid = next(self._ids)
            if reply:
                self._pending[rid] = (fut, loop)
            if begun is not None:
                self._starting[rid] = (begun, loop)
        try:
            with self._send_lock:
                self.conn.send((rid, op, payload))
        except (OSError, ValueError) as exc:  # the socket broke: the worker is gone
            self.forget(rid)
            raise WorkerDied(f"{self.name} (pid {self.pid}): {exc}", sent=False) from None
        return rid, fut

    def forget(self, rid: int, *, reply: bool = True) -> None:
        """Stop tracking request `rid` (and its reply, if `reply`)."""
        with self._lock:
            if reply:
                self._pending.pop(rid, None)
            self._starting.pop(rid, None)

    async def _wait(
        self,
        rid: int,
        fut: asyncio.Future[Any],
        begun: asyncio.Future[Any],
        timeout_s: float | None,
        label: str,
    ) -> Any:
        killed = False
        try:
            if not await self._serving(fut):
                self.forget(rid)
                self.kill(f"it did not start within {self.start_timeout_s:g}s")
                raise WorkerStartTimeout(
                    f"{self.name} did not start within {self.start_timeout_s:g}s"
                )
            if timeout_s is None:
                return await fut
            await wait_turn(self, rid, fut, begun, timeout_s, label)  # no clock yet
            if fut.done() or not begun.done():  # answered, or the worker died meanwhile
                return await fut
            self.deadlines[rid] = time.monotonic() + timeout_s  # its clock: from now
            ending = await enforce(self, rid, fut, timeout_s, label)
            if ending == "answered":
                return await fut
            killed = ending == "killed"
        finally:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" noise for a dead worker
        self.counters.timeouts += 1
        raise CallTimeout(f"{label} took longer than {timeout_s:g}s", killed=killed)

    async def _serving(self, fut: asyncio.Future[Any]) -> bool:
        """Wait until the worker serves calls, or `fut` (a call on it) is settled; False
        when neither happened within `start_timeout_s`."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.ready or not self.alive:
                return True
            ready = loop.create_future()
            self._ready_waiters.append((ready, loop))
        done, _ = await asyncio.wait(
            {ready, fut}, timeout=self.start_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        ready.cancel()  # if still pending: a later wake finds it done and leaves it
        return bool(done)

    async def holder(self) -> int | str | None:
        """The request whose code holds the worker's event loop now (read from the memory
        shared with the child; when none, the worker is asked): None when the loop is
        free, `unknown` when the worker does not answer within 1s, `dead` when it is gone."""
        running = self.running.get()
        if running >= 0:
            return running
        try:
            rid, fut = self._submit("who", None)
        except WorkerDied:
            return "dead"
        try:
            return await asyncio.wait_for(fut, 1.0)
        except WorkerDied:
            return "dead"
        except TimeoutError:
            self.forget(rid)
            return "unknown"

    def cancel_in_worker(self, rid: int) -> None:
        """Ask the worker to cancel call `rid` (an `await` in it that never returns)."""
        with contextlib.suppress(WorkerDied):
            self._submit("cancel", rid, reply=False)

    async def reaped(self, timeout_s: float = 30.0) -> None:
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
                    if rid == STARTED:  # call `payload` began: its clock starts
                        rid, ok, payload = payload, True, None
                        waiter = self._starting.pop(rid, None)
                        self.begun += 1
                    else:
                        waiter = self._pending.pop(rid, None)
                if waiter is not None:
                    _wake(waiter, payload, None if ok else CallError(*payload))
        except (EOFError, OSError):
            pass
        except Exception:  # a reply that does not unpickle here: the worker is unusable
            log.exception("%s sent a reply that cannot be read; killing it", self.name)
            self.kill("its reply could not be read")
        self._on_death()

    def _on_ready(self, ok: bool, payload: ErrorInfo | None) -> None:
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
            self._starting.clear()  # a call not yet begun learns of the death from `fut`
            ready_waiters, self._ready_waiters = self._ready_waiters, []
        for rid, waiter in waiting.items():  # unknown cause (-1): everyone is suspect
            error = WorkerDied(
                why, culprit=culprit in (rid, -1), how=self.how, init_error=self.init_error
            )
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
        if not self._killed and self.process.poll() is None:
            self._killed = True  # once: other calls' bounds may expire while it dies
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
