"""`sandbox.run` / `run_async` / `SandboxPool`: results, limits, statuses, retries."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from rldojo.sandbox import ExecSpec, Limits, SandboxPool
from rldojo.sandbox.slots import processes_of_uid

pytestmark = pytest.mark.slow  # the sandbox: processes

GENEROUS_S = 60.0  # the wall limit of programs that end by themselves (not under test)


def test_run_returns_output_and_exit_code(pool: SandboxPool) -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"
    start = time.monotonic()
    result = pool.run(code, timeout_s=GENEROUS_S)
    elapsed = time.monotonic() - start
    assert result.status == "ok"
    assert result.returncode == 3
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.host_uid in pool.uids and result.host_uid != 0
    assert 0 < result.wall_s <= elapsed  # measured inside the call


def test_stdin_and_files(pool: SandboxPool) -> None:
    code = "import sys\nprint(sys.stdin.read().upper(), open('data.txt').read())"
    result = pool.run(code, stdin="hello", files={"data.txt": "from file"}, timeout_s=GENEROUS_S)
    assert result.stdout == "HELLO from file\n"


def test_files_stay_in_the_sandbox(pool: SandboxPool, tmp_path) -> None:
    code = "open('/work/new.txt', 'w').write('x')\nimport os\nprint(os.getcwd())"
    result = pool.run(code, timeout_s=GENEROUS_S)
    assert result.stdout == "/work\n"
    assert not (tmp_path / "new.txt").exists()


def test_exception_is_ok_status_with_traceback(pool: SandboxPool) -> None:
    result = pool.run("raise ValueError('boom')", timeout_s=GENEROUS_S)
    assert result.status == "ok" and result.returncode == 1
    assert "ValueError: boom" in result.stderr


_WAITING = 1 << (signal.SIGUSR2 - 1)  # a job blocks SIGUSR2 too: its mark in SigBlk


def _waiting_jobs(pool: SandboxPool, released: set[int]) -> dict[int, int]:
    """{uid: host pid} of the jobs waiting for SIGUSR1 (not yet released), per slot uid.
    (`sigwait` unblocks the signal it waits for, so SIGUSR2 is the mark.)"""
    found = {}
    for uid in pool.uids:
        for pid in processes_of_uid(uid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            mask = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
            if pid not in released and int(mask.split()[1], 16) & _WAITING:
                found[uid] = pid
    return found


def test_run_async_runs_concurrently(pool: SandboxPool) -> None:
    """Four jobs on two slots; each waits until the host releases it, and the host
    releases jobs two at a time, once both slots hold a waiting job: the jobs finish only
    if the slots run them in parallel (one at a time, none would ever be released)."""
    code = (
        "import signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})\n"
        "signal.sigwait({signal.SIGUSR1})\n"
        "print(%d)\n"
    )

    async def release() -> None:
        released: set[int] = set()
        while True:
            waiting = _waiting_jobs(pool, released)
            if len(waiting) == 2:
                for pid in waiting.values():
                    os.kill(pid, signal.SIGUSR1)
                    released.add(pid)
            await asyncio.sleep(0.01)

    async def main() -> list[tuple[str, str]]:
        jobs = [pool.run_async(code % i, timeout_s=120) for i in range(4)]
        releaser = asyncio.ensure_future(release())
        try:
            return [(r.status, r.stdout) for r in await asyncio.gather(*jobs)]
        finally:
            releaser.cancel()

    assert asyncio.run(main()) == [("ok", f"{i}\n") for i in range(4)]


def test_sandbox_error_is_retried_and_reported(pool: SandboxPool) -> None:
    # A trusted script that never announces its start looks like a broken sandbox.
    result = pool.execute(ExecSpec(script=b"pass\n", limits=Limits(timeout_s=60)))
    assert result.status == "sandbox_error"
    assert result.attempts == pool.retries + 1
    assert "did not start" in result.error


def test_memory_limit_status(pool: SandboxPool, leftovers) -> None:
    result = pool.run("x = bytearray(2 * 1024**3)", memory_mb=256, timeout_s=GENEROUS_S)
    assert result.status == "memory"
    assert leftovers(pool) == []
