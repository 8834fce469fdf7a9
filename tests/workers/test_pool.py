"""WorkerPool / WorkerProcess with real processes: results, errors, timeouts that kill and
replace, deaths blamed on the call that was running, kills from outside, cleanup.

The functions run in the workers are stdlib ones (importable in any interpreter), so the
tests do not depend on how pytest imports this module. No assertion depends on timing:
conditions are awaited with a bound, and a timeout is short only where it is under test.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rldojo.workers import (
    CallError,
    CallTimeout,
    WorkerDied,
    WorkerPool,
    WorkerProcess,
)

pytestmark = pytest.mark.slow  # worker processes

LONG = 120.0  # for calls whose timeout is not under test: never reached
FOREVER = 3600  # what a stuck call would take: only a kill or a cancel ends it


def _gone(pid: int) -> bool:
    """Whether `pid` no longer runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


async def _until(condition: Callable[[], bool], bound_s: float = 60.0) -> None:
    """Wait until `condition()` holds, failing after `bound_s` (a hang bound, not a timing)."""
    end = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {bound_s}s")
        await asyncio.sleep(0.01)


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    p = WorkerPool(1, name="test worker")
    yield p
    p.close()


async def _call(worker: WorkerProcess, fn, *args, timeout_s: float = LONG):
    return await worker.call(fn, args, timeout_s=timeout_s)


def test_call_returns_and_the_worker_stays_warm(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        assert await _call(worker, operator.add, 2, 3) == 5
        ordered = await worker.call(sorted, ([3, 1, 2],), {"reverse": True}, timeout_s=LONG)
        assert ordered == [3, 2, 1]
        assert await _call(worker, asyncio.sleep, 0, "async") == "async"  # a coroutine fn
        first, second = await _call(worker, os.getpid), await _call(worker, os.getpid)
        assert first == second == worker.pid != os.getpid()
        assert pool.worker() is worker

    asyncio.run(main())
    assert pool.counters.as_dict() == {
        "started": 1, "replaced": 0, "timeouts": 0, "killed": 0, "died": 0,
    }  # fmt: skip


def test_plain_functions_see_no_running_loop(pool: WorkerPool) -> None:
    code = "__import__('asyncio').run(__import__('asyncio').sleep(0, 'inner'))"
    assert asyncio.run(_call(pool.worker(), eval, code)) == "inner"


def test_raise_is_a_call_error_and_the_worker_survives(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        pid = await _call(worker, os.getpid)
        with pytest.raises(CallError) as info:
            await _call(worker, int, "not a number")
        assert info.value.exc_type == "ValueError"
        assert "invalid literal" in info.value.message
        assert "Traceback" in info.value.remote_traceback
        with pytest.raises(CallError, match="cannot send the result"):
            await _call(worker, threading.Lock)  # a result that does not pickle
        with pytest.raises(CallError, match="SystemExit"):
            await _call(worker, exec, "raise SystemExit(2)")
        assert await _call(worker, os.getpid) == pid

    asyncio.run(main())
    assert pool.counters.died == 0 and pool.counters.replaced == 0


def test_blocking_call_past_its_timeout_is_killed_and_replaced(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        old = await _call(worker, os.getpid)
        neighbour = asyncio.ensure_future(_call(worker, asyncio.sleep, FOREVER))
        await _until(lambda: worker.in_flight == 1 or neighbour.done())  # sent first
        with pytest.raises(CallTimeout, match=r"took longer than 0\.5s") as info:
            await _call(worker, time.sleep, FOREVER, timeout_s=0.5)  # the timeout under test
        assert info.value.killed
        assert _gone(old)  # killed and reaped before the timeout was raised
        with pytest.raises(WorkerDied) as died:  # killed for another call: not its fault
            await neighbour
        assert not died.value.culprit and died.value.how == "killed by SIGKILL"
        fresh = pool.worker()
        assert fresh is not worker and await _call(fresh, os.getpid) != old

    asyncio.run(main())
    c = pool.counters
    assert (c.started, c.replaced, c.timeouts, c.killed) == (2, 1, 1, 1)


def test_calls_queued_behind_a_killed_call_die_with_it_uncharged(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        await _call(worker, os.getpid)  # serving
        blocker = asyncio.ensure_future(_call(worker, time.sleep, FOREVER, timeout_s=0.5))
        await _until(lambda: worker.running.get() >= 0 or blocker.done())  # holds the loop
        queued = [asyncio.ensure_future(_call(worker, os.getpid, timeout_s=0.5)) for _ in "ab"]
        with pytest.raises(CallTimeout) as info:
            await blocker
        assert info.value.killed
        for call in queued:  # never begun: the kill, not their clocks, ends them
            with pytest.raises(WorkerDied) as died:
                await call
            assert not died.value.culprit

    asyncio.run(main())
    assert (pool.counters.timeouts, pool.counters.killed) == (1, 1)


def test_a_call_waiting_its_turn_is_not_charged_the_wait(pool: WorkerPool, tmp_path: Path) -> None:
    """Its clock starts when the worker begins it: behind a call that holds the loop for
    more than twice its timeout, it still answers."""
    fifo = tmp_path / "go"
    os.mkfifo(fifo)

    async def main() -> None:
        worker = pool.worker()
        await _call(worker, os.getpid)  # serving
        holder = asyncio.ensure_future(_call(worker, Path.read_text, fifo))  # until written
        await _until(lambda: worker.running.get() >= 0 or holder.done())
        queued = asyncio.ensure_future(_call(worker, os.getpid, timeout_s=1.0))
        await asyncio.sleep(2.5)  # at least this long: a lower bound, not a timing
        assert not queued.done()  # still waiting its turn, not timed out
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the holder has it open
        os.write(writer, b"go")
        os.close(writer)
        assert await holder == "go"
        assert await queued == worker.pid

    asyncio.run(main())
    assert pool.counters.timeouts == 0 and pool.counters.killed == 0


def test_a_call_queued_behind_one_without_timeout_is_bounded(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        await _call(worker, os.getpid)  # serving
        holder = asyncio.ensure_future(worker.call(time.sleep, (FOREVER,), timeout_s=None))
        await _until(lambda: worker.running.get() >= 0 or holder.done())
        with pytest.raises(WorkerDied) as died:  # the worker ran nothing more: stuck
            await _call(worker, os.getpid, timeout_s=0.5)
        assert not died.value.culprit
        with pytest.raises(WorkerDied) as stuck:
            await holder
        assert stuck.value.culprit  # its code held the loop when the worker was killed

    asyncio.run(main())
    assert (pool.counters.timeouts, pool.counters.killed) == (0, 1)


def test_awaiting_call_past_its_timeout_is_cancelled_not_killed(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        pid = await _call(worker, os.getpid)
        with pytest.raises(CallTimeout) as info:  # the loop is free: a cancel is enough
            await _call(worker, asyncio.sleep, FOREVER, timeout_s=0.5)
        assert not info.value.killed
        assert await _call(worker, os.getpid) == pid and worker.is_alive()

    asyncio.run(main())
    assert pool.counters.killed == 0 and pool.counters.timeouts == 1


def test_worker_that_exits_is_blamed_on_the_running_call(pool: WorkerPool) -> None:
    async def main() -> None:
        worker = pool.worker()
        await _call(worker, os.getpid)  # serving
        neighbour = asyncio.ensure_future(_call(worker, asyncio.sleep, FOREVER))
        await _until(lambda: worker.in_flight == 1 or neighbour.done())
        with pytest.raises(WorkerDied, match="exited with code 7") as culprit:
            await _call(worker, exec, "import os; os._exit(7)")
        assert culprit.value.culprit and culprit.value.how == "exited with code 7"
        with pytest.raises(WorkerDied) as bystander:
            await neighbour
        assert not bystander.value.culprit  # it was only waiting in the same worker
        assert await _call(pool.worker(), operator.mul, 6, 7) == 42  # replaced

    asyncio.run(main())
    assert (pool.counters.died, pool.counters.killed, pool.counters.replaced) == (1, 0, 1)


def test_kill_from_outside_fails_the_waiting_calls_and_the_worker_is_replaced(
    pool: WorkerPool,
) -> None:
    async def main() -> None:
        worker = pool.worker()
        pid = await _call(worker, os.getpid)
        waiting = asyncio.ensure_future(_call(worker, asyncio.sleep, FOREVER))
        await _until(lambda: worker.in_flight == 1 or waiting.done())
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied) as info:
            await waiting
        assert info.value.how == "killed by SIGKILL"
        assert info.value.culprit  # no code was running: the cause is unknown, all suspect
        assert not worker.is_alive() and _gone(pid)
        with pytest.raises(WorkerDied) as late:  # a call on the dead one never reaches it
            await _call(worker, os.getpid)
        assert not late.value.sent
        fresh = pool.worker()
        assert await _call(fresh, os.getpid) == fresh.pid != pid

    asyncio.run(main())
    assert (pool.counters.died, pool.counters.killed, pool.counters.replaced) == (1, 0, 1)


def test_failed_initializer_is_reported_with_the_death() -> None:
    with pytest.raises(TypeError, match="picklable"):
        WorkerPool(1, initializer=lambda: None)
    pool = WorkerPool(1, initializer=int, initargs=("x",))
    try:
        with pytest.raises(WorkerDied, match="initializer failed: ValueError") as info:
            asyncio.run(_call(pool.worker(), os.getpid))
        assert info.value.init_error is not None and info.value.init_error[0] == "ValueError"
    finally:
        pool.close()


def test_least_loaded_worker_is_handed_out_and_close_reaps_all() -> None:
    pool = WorkerPool(2, name="test worker")
    pool.start()
    first = pool.worker()
    first.residents += 1  # e.g. an open environment lives there
    second = pool.worker()
    assert second is not first and pool.worker() is second
    pids = pool.pids
    assert sorted(pids) == sorted([first.pid, second.pid])
    pool.close()
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.worker()
