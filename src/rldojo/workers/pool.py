"""`WorkerPool`: `size` worker processes, each replaced when it dies or is killed.

    pool = WorkerPool(2, name="grader worker", initializer=warm_up)
    result = await pool.worker().call(fn, (x,), timeout_s=5.0)

`worker()` hands out the least busy live worker, starting any slot that is empty or whose
worker died (counted in `counters.replaced`); `slot(i)` hands out slot `i`'s. A user
that wants a fresh worker warming up at once after a kill calls `restart(worker)`. What a
call can end in is in `rldojo.workers.process`. The pool may be used from several event
loops in several threads: slot changes hold a lock.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

from rldojo.workers.process import Counters, WorkerProcess

__all__ = ["WorkerPool"]


class WorkerPool:
    """`size` slots of `WorkerProcess`es, filled on demand (or all with `start()`).

    Args:
        size: how many workers.
        name: workers are named `{name} {i}` in messages and logs.
        initializer, initargs: a picklable top-level function (and its arguments) run once
            in each new worker, e.g. an import that is slow the first time.
        start_timeout_s: how long a new worker may take to start serving calls.
        die_with_parent: see `WorkerProcess` (`PR_SET_PDEATHSIG`).
    """

    def __init__(
        self,
        size: int,
        *,
        name: str = "worker",
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        start_timeout_s: float = 120.0,
        die_with_parent: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        try:  # fail here, not in a half-started child
            init_blob = pickle.dumps((initializer, initargs))
        except Exception as exc:
            raise TypeError(f"initializer and initargs must be picklable: {exc}") from exc
        self.name = name
        self.counters = Counters()
        self.slots: list[WorkerProcess | None] = [None] * size
        self._spawn_kwargs: dict[str, Any] = {
            "init_blob": init_blob,
            "start_timeout_s": start_timeout_s,
            "die_with_parent": die_with_parent,
            "counters": self.counters,
        }
        self._lock = threading.Lock()
        self.closed = False

    @property
    def size(self) -> int:
        return len(self.slots)

    @property
    def pids(self) -> list[int]:
        """Pids of the live workers."""
        return [w.pid for w in self.slots if w is not None and w.is_alive()]

    def start(self) -> None:
        """Start every missing worker now, so they warm up in parallel."""
        with self._lock:
            for i in range(self.size):
                self._fill(i)

    def worker(self) -> WorkerProcess:
        """The live worker with the lowest `load()` (starting any that are missing)."""
        with self._lock:
            workers = [self._fill(i) for i in range(self.size)]
        return min(workers, key=WorkerProcess.load)

    def slot(self, i: int) -> WorkerProcess:
        """Slot `i`'s live worker (started if missing or dead)."""
        with self._lock:
            return self._fill(i)

    def restart(self, worker: WorkerProcess, why: str = "restarted") -> None:
        """Kill `worker` (if alive; waits until it is reaped) and start its replacement now,
        so that it warms up while nobody waits for it."""
        worker.kill_and_wait(why)
        with self._lock:
            if worker in self.slots and not self.closed:
                self._fill(self.slots.index(worker))

    def _fill(self, i: int) -> WorkerProcess:
        if self.closed:
            raise RuntimeError(f"{self.name} pool is closed")
        old = self.slots[i]
        if old is not None and old.is_alive():
            return old
        if old is not None:
            self.counters.replaced += 1
        new = self.slots[i] = WorkerProcess(f"{self.name} {i}", **self._spawn_kwargs)
        return new

    def close(self, grace_s: float = 2.0) -> None:
        """Stop every worker: hang up, give them `grace_s` to exit, then SIGKILL. Idempotent."""
        with self._lock:
            self.closed = True
            workers = [w for w in self.slots if w is not None]
            self.slots = [None] * len(self.slots)
        for w in workers:
            w.hang_up()  # all at once: they exit in parallel
        for w in workers:
            w.close(grace_s)
