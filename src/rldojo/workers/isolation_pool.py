"""`IsolatedPool`: up to `size` hard-timeout worker processes shared by asyncio callers.

The workers are `rldojo.workers.isolation.IsolatedWorker`s (see there for what a call can
end in). One pool may serve several event loops in several threads at once (the trainer's
loop and the async rollout producer's): its state changes hold a lock, and a worker is
handed to a waiting caller on that caller's own loop.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rldojo.workers.isolation import IsolatedWorker

T = TypeVar("T")

__all__ = ["IsolatedPool"]


class IsolatedPool:
    """Up to `size` `IsolatedWorker`s shared by concurrent asyncio callers.

    Workers start on demand (or all at once with `start()`) and are reused across calls.
    Callers beyond `size` wait for a free worker; that wait is not part of `timeout_s`.
    Constructor arguments other than `size` are passed to each `IsolatedWorker`.
    """

    def __init__(
        self,
        size: int = 2,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        start_timeout_s: float = 60.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"IsolatedPool size must be >= 1, got {size}")
        self.size = size
        self._worker_kwargs: dict[str, Any] = {
            "initializer": initializer,
            "initargs": initargs,
            "start_timeout_s": start_timeout_s,
        }
        self._workers: list[IsolatedWorker] = []
        self._idle: collections.deque[IsolatedWorker] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[IsolatedWorker]] = collections.deque()
        self._closed = False
        self._lock = threading.RLock()

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    @property
    def pids(self) -> list[int]:
        """Pids of the running children."""
        return [pid for w in self._workers if (pid := w.pid) is not None]

    def start(self) -> None:
        """Start all `size` children now so they warm up in parallel."""
        while len(self._workers) < self.size:
            self._idle.append(self._new_worker())
        for worker in self._workers:
            worker.start()

    async def call(
        self, fn: Callable[..., T], *args: object, timeout_s: float, **kwargs: object
    ) -> T:
        """Run `fn(*args, **kwargs)` on a free worker; same outcomes as `IsolatedWorker.call`."""
        worker = await self._acquire()
        try:
            return await worker.call(fn, *args, timeout_s=timeout_s, **kwargs)
        finally:
            self._release(worker)

    def _new_worker(self) -> IsolatedWorker:
        if self._closed:
            raise RuntimeError("IsolatedPool is closed")
        worker = IsolatedWorker(**self._worker_kwargs)
        self._workers.append(worker)
        return worker

    # One pool may serve several event loops in several threads (the trainer's loop and the
    # async rollout producer's): state changes hold `_lock`, and a worker is handed to a
    # waiter on the waiter's own loop (`call_soon_threadsafe`).

    async def _acquire(self) -> IsolatedWorker:
        with self._lock:
            if self._closed:
                raise RuntimeError("IsolatedPool is closed")
            if self._idle:
                return self._idle.popleft()
            if len(self._workers) < self.size:
                return self._new_worker()
            waiter: asyncio.Future[IsolatedWorker] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # handed over just as we were cancelled
            raise

    def _release(self, worker: IsolatedWorker) -> None:
        with self._lock:
            if not self._closed:
                while self._waiters:
                    waiter = self._waiters.popleft()
                    loop = waiter.get_loop()
                    if not waiter.done() and not loop.is_closed():
                        loop.call_soon_threadsafe(self._hand_over, waiter, worker)
                        return
                self._idle.append(worker)
                return
        worker.close()

    def _hand_over(self, waiter: asyncio.Future[IsolatedWorker], worker: IsolatedWorker) -> None:
        if waiter.done():  # cancelled after it was chosen: give the worker to the next one
            self._release(worker)
        else:
            waiter.set_result(worker)

    def close(self) -> None:
        """Stop every child; pending and later calls raise RuntimeError. Idempotent."""
        with self._lock:
            self._closed = True
            workers, waiters = list(self._workers), list(self._waiters)
            self._idle.clear()
            self._waiters.clear()
        for worker in workers:
            worker.close()
        for waiter in waiters:
            loop = waiter.get_loop()
            if not waiter.done() and not loop.is_closed():
                loop.call_soon_threadsafe(_fail_waiter, waiter)

    def __enter__(self) -> IsolatedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fail_waiter(waiter: asyncio.Future[IsolatedWorker]) -> None:
    if not waiter.done():
        waiter.set_exception(RuntimeError("IsolatedPool is closed"))
