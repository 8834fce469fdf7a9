"""A call's timeout on a worker: its clock runs while the worker runs the call, not while
the call waits its turn. `rldojo.workers.process` states the semantics; these two steps of
`WorkerProcess.call` enforce them:

- `wait_turn`: the call is sent, not yet begun (calls ahead of it run, or one holds the
  worker's event loop): no clock. It waits while the worker makes progress (begins calls)
  or a call with a deadline holds the loop (that call's owner acts then), until that
  deadline plus the call's own timeout; a worker that does neither for the call's timeout
  (asked then, so that its messages in flight count) is stuck and killed. Either way the
  worker's death answers the call (`WorkerDied`);
- `enforce`: the call runs, its clock too. Past its deadline the worker is killed (the
  call holds its loop, or the worker does not answer), or the call is cancelled in the
  worker (the loop is free), or, while another call holds the loop, it waits for that
  call's fate: until that call's deadline plus its own timeout at most, then the kill.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rldojo.workers.process import WorkerProcess

Ending = Literal["answered", "killed", "cancelled"]
"""How `enforce` ended a call: its answer came (a death answers too), its worker was
killed for it, or it was cancelled in the worker."""

_RECHECK_S = 0.2
"""How often a call past its deadline looks again at who holds the worker's loop."""


async def wait_turn(
    worker: WorkerProcess,
    rid: int,
    fut: asyncio.Future[Any],
    begun: asyncio.Future[Any],
    timeout_s: float,
    label: str,
) -> None:
    """Return once call `rid` has begun (`begun`) or is answered (`fut`), or its worker is
    gone (or killed here as stuck: then its death answers the call)."""
    end = time.monotonic() + timeout_s
    progress = worker.begun
    while not (begun.done() or fut.done()) and worker.alive:
        await asyncio.wait(
            {begun, fut},
            timeout=max(0.0, end - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if time.monotonic() >= end and worker.running.get() < 0:
            await worker.holder()  # asked: the messages it sent before answering are in
        running, now = worker.running.get(), time.monotonic()
        if worker.begun != progress or running == rid:  # the calls ahead of it move
            progress, end = worker.begun, now + timeout_s
        holder = worker.deadlines.get(running)  # its owner acts at that deadline
        if holder is not None:
            end = max(end, holder + timeout_s)
        if now >= end and not (begun.done() or fut.done()):
            worker.kill(f"{label} waited {timeout_s:g}s for a worker that runs nothing")
            return


async def enforce(
    worker: WorkerProcess, rid: int, fut: asyncio.Future[Any], timeout_s: float, label: str
) -> Ending:
    """Await call `rid`'s answer until its deadline (`worker.deadlines[rid]`), then end it."""
    deadline = worker.deadlines[rid]
    hard = deadline + timeout_s
    while True:
        await asyncio.wait({fut}, timeout=max(0.0, deadline - time.monotonic()))
        if fut.done():
            return "answered"
        holder = await worker.holder()
        if holder == "dead" or fut.done():  # answered while asked (a death answers too)
            return "answered"
        if holder == rid or holder == "unknown" or time.monotonic() >= hard:
            worker.forget(rid)
            worker.kill(f"{label} held the worker for {timeout_s:g}s")
            await worker.reaped()
            return "killed"
        if holder is None:  # the loop is free: this call waits on nothing
            worker.forget(rid)
            worker.cancel_in_worker(rid)
            return "cancelled"
        if isinstance(holder, int):  # another call holds the loop: its fate first
            hard = max(hard, worker.deadlines.get(holder, 0.0) + timeout_s)
        deadline = min(hard, time.monotonic() + _RECHECK_S)
