"""IsolatedWorker / IsolatedPool: results, remote errors, hard timeouts, crashes, cleanup.

The functions run in the children are stdlib functions (importable anywhere), so the
tests do not depend on how pytest imports this module.
"""

from __future__ import annotations

import asyncio
import ctypes
import operator
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rldojo.workers.isolation import (
    IsolatedWorker,
    IsolationCrash,
    IsolationTimeout,
    RemoteError,
)
from rldojo.workers.isolation_pool import IsolatedPool

pytestmark = pytest.mark.slow  # worker processes, killed and timed out


def _alive(pid: int) -> bool:
    """True if `pid` runs (a zombie left to an init that does not reap counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _our_children() -> list[int]:
    """Pids of live processes whose parent is this test process (Linux /proc)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def worker():
    w = IsolatedWorker()
    yield w
    w.close()


def test_call_returns_result_and_child_stays_warm(worker: IsolatedWorker) -> None:
    async def main() -> tuple[int, int, int]:
        assert await worker.call(operator.add, 2, 3, timeout_s=10) == 5
        return (
            await worker.call(os.getpid, timeout_s=10),
            await worker.call(os.getpid, timeout_s=10),
            await worker.call(sorted, [3, 1, 2], timeout_s=10, reverse=True),
        )

    first, second, ordered = asyncio.run(main())
    assert first == second == worker.pid != os.getpid()
    assert ordered == [3, 2, 1]


def test_remote_exception_is_reported_and_worker_survives(worker: IsolatedWorker) -> None:
    async def main() -> None:
        pid = await worker.call(os.getpid, timeout_s=10)
        with pytest.raises(RemoteError) as info:
            await worker.call(int, "not a number", timeout_s=10)
        assert info.value.exc_type == "ValueError"
        assert "invalid literal" in str(info.value)
        assert "Traceback" in info.value.remote_traceback
        with pytest.raises(RemoteError, match="pickle"):  # a result that cannot come back
            await worker.call(threading.Lock, timeout_s=10)
        assert await worker.call(os.getpid, timeout_s=10) == pid

    asyncio.run(main())


def test_hang_times_out_kills_child_and_next_call_works(worker: IsolatedWorker) -> None:
    async def main() -> None:
        old = await worker.call(os.getpid, timeout_s=10)
        start = time.monotonic()
        with pytest.raises(IsolationTimeout):
            await worker.call(time.sleep, 3600, timeout_s=0.5)
        elapsed = time.monotonic() - start
        assert 0.5 <= elapsed < 60  # the timeout, not the hour-long call, ended it
        assert not _alive(old)
        new = await worker.call(os.getpid, timeout_s=10)
        assert new != old

    asyncio.run(main())


@pytest.mark.parametrize(
    ("fn", "arg", "how"),
    [(os._exit, 3, "exited with code 3"), (ctypes.string_at, 0, "SIGSEGV")],
    ids=["os_exit", "segfault"],
)
def test_crash_is_reported_and_next_call_works(worker: IsolatedWorker, fn, arg, how) -> None:
    async def main() -> None:
        with pytest.raises(IsolationCrash, match=how):
            await worker.call(fn, arg, timeout_s=10)
        assert await worker.call(operator.mul, 6, 7, timeout_s=10) == 42

    asyncio.run(main())


def test_cancelled_call_kills_busy_child(worker: IsolatedWorker) -> None:
    async def main() -> None:
        old = await worker.call(os.getpid, timeout_s=10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(worker.call(time.sleep, 3600, timeout_s=600), 0.3)
        assert not _alive(old)
        assert await worker.call(operator.add, 1, 1, timeout_s=10) == 2

    asyncio.run(main())


def test_failed_initializer_is_a_crash() -> None:
    with (
        IsolatedWorker(initializer=int, initargs=("x",)) as w,
        pytest.raises(IsolationCrash, match="initializer failed: ValueError"),
    ):
        asyncio.run(w.call(os.getpid, timeout_s=10))


def test_pool_runs_calls_in_parallel_and_across_event_loops(tmp_path: Path) -> None:
    with IsolatedPool(2) as pool:
        pool.start()

        async def warm() -> set[int]:
            return set(
                await asyncio.gather(*(pool.call(os.getpid, timeout_s=30) for _ in range(2)))
            )

        async def rendezvous() -> list[int]:
            # Each call marks its arrival, then waits for the other's mark: both return
            # only if they run at the same time (run one after the other, the first would
            # wait until its timeout).
            a, b = tmp_path / "a", tmp_path / "b"
            script = 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.01; done'
            calls = (
                pool.call(
                    subprocess.call, ["sh", "-c", script, "sh", str(x), str(y)], timeout_s=120
                )
                for x, y in ((a, b), (b, a))
            )
            return list(await asyncio.gather(*calls))

        pids = asyncio.run(warm())
        assert len(pool.pids) == 2 and pids <= set(pool.pids)
        assert asyncio.run(rendezvous()) == [0, 0]  # the two calls ran in parallel

        async def many() -> list[int]:  # more callers than workers: they queue
            return await asyncio.gather(*(pool.call(abs, -i, timeout_s=10) for i in range(7)))

        assert asyncio.run(many()) == list(range(7))


def test_pool_is_shared_by_event_loops_in_two_threads() -> None:
    """The async trainer grades in its rollout thread while an evaluation grades in the
    main thread, through one pool: workers are handed across loops, none lost."""
    with IsolatedPool(1) as pool:
        results: dict[str, list[int]] = {}

        async def many(tag: str, base: int) -> None:
            calls = (pool.call(operator.add, base, i, timeout_s=30) for i in range(12))
            results[tag] = list(await asyncio.gather(*calls))

        thread = threading.Thread(target=lambda: asyncio.run(many("thread", 100)))
        thread.start()
        asyncio.run(many("main", 0))
        thread.join(timeout=60)
        assert results == {"main": list(range(12)), "thread": list(range(100, 112))}
        assert len(pool.pids) == 1  # one worker, passed back and forth


def test_pool_survives_timeouts_under_concurrency() -> None:
    with IsolatedPool(2) as pool:

        async def main() -> list[object]:
            calls = [pool.call(time.sleep, 3600, timeout_s=0.4)] + [
                pool.call(operator.add, i, 1, timeout_s=120) for i in range(4)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

        results = asyncio.run(main())
        assert isinstance(results[0], IsolationTimeout)
        assert results[1:] == [1, 2, 3, 4]


def test_close_leaves_no_child_processes() -> None:
    before = set(_our_children())
    pool = IsolatedPool(3)
    pool.start()

    async def main() -> None:
        await asyncio.gather(*(pool.call(os.getpid, timeout_s=30) for _ in range(3)))
        with pytest.raises(IsolationTimeout):  # a restarted child must be cleaned up too
            await pool.call(time.sleep, 3600, timeout_s=0.3)

    asyncio.run(main())
    pids = pool.pids
    assert len(pids) == 3
    pool.close()
    assert not any(_alive(pid) for pid in pids)
    assert set(_our_children()) <= before
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(pool.call(os.getpid, timeout_s=10))


def test_child_exits_when_parent_dies(tmp_path: Path) -> None:
    script = (
        "import asyncio, os, sys, time\n"
        "from rldojo.workers.isolation import IsolatedWorker\n"
        "async def main():\n"
        "    w = IsolatedWorker()\n"
        "    print(await w.call(os.getpid, timeout_s=30), flush=True)\n"
        "    task = asyncio.ensure_future(w.call(time.sleep, 3600, timeout_s=3600))\n"
        "    await asyncio.sleep(0.2)  # the task sent the call at its first step, before this\n"
        "    os._exit(0)  # the parent vanishes while the child is busy\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 60  # the call would keep it for an hour
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_timeout_also_kills_what_the_function_started(
    worker: IsolatedWorker, tmp_path: Path
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    command = [
        "sh",
        "-c",
        f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 3600",
    ]
    # The timeout under test must fire after the grandchild started: on a machine too slow
    # to start it within the timeout, try again with a longer one.
    for timeout_s in (1.0, 4.0, 16.0, 64.0):
        with pytest.raises(IsolationTimeout):
            asyncio.run(worker.call(subprocess.call, command, timeout_s=timeout_s))
        if pidfile.exists():
            break
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 60  # it would sleep for an hour
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
