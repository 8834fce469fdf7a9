"""Where a worker's output goes (`rldojo.workers.spawn`) and `WorkerProcess.terminate`,
with real processes. The functions called are stdlib ones (importable anywhere); waits
are bounded polls on the condition asserted."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from rldojo.workers import CallError, WorkerDied, WorkerProcess

pytestmark = pytest.mark.slow  # worker processes

LONG = 120.0


async def _until(condition, bound_s: float = 60.0) -> None:
    end = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {bound_s}s")
        await asyncio.sleep(0.01)


def test_a_workers_stdout_and_stderr_are_appended_to_its_output_file(tmp_path, capfd):
    log = tmp_path / "train.log"
    log.write_text("before\n")

    async def main() -> None:
        worker = WorkerProcess("logged", output=log)
        try:
            await worker.call(os.write, (1, b"stdout-mark\n"), timeout_s=LONG)
            await worker.call(os.write, (2, b"stderr-mark\n"), timeout_s=LONG)
            assert await worker.call(os.system, ("echo grandchild-mark >&2",), timeout_s=LONG) == 0
        finally:
            worker.close()

    asyncio.run(main())
    lines = log.read_text().splitlines()
    assert lines[0] == "before"  # appended, not truncated
    assert {"stdout-mark", "stderr-mark", "grandchild-mark"} <= set(lines)
    out, err = capfd.readouterr()
    assert "mark" not in out + err


def test_terminate_asks_the_worker_alone_to_stop():
    async def main() -> None:
        handled = WorkerProcess("handles SIGTERM")
        plain = WorkerProcess("default SIGTERM")
        try:
            # a worker whose function handles SIGTERM: the call ends, the worker lives on
            await handled.call(signal.signal, (signal.SIGTERM, signal.default_int_handler),
                               timeout_s=LONG)  # fmt: skip
            call = asyncio.ensure_future(handled.call(time.sleep, (3600,), timeout_s=LONG))
            await _until(lambda: handled.running.get() >= 0)  # the sleep is running
            handled.terminate()
            with pytest.raises(CallError) as caught:
                await call
            assert caught.value.exc_type == "KeyboardInterrupt" and handled.is_alive()
            assert await handled.call(abs, (-3,), timeout_s=LONG) == 3
            # a worker that does not handle it dies of it
            call = asyncio.ensure_future(plain.call(time.sleep, (3600,), timeout_s=LONG))
            await _until(lambda: plain.running.get() >= 0)
            plain.terminate()
            with pytest.raises(WorkerDied) as died:
                await call
            assert died.value.how == "killed by SIGTERM"
        finally:
            handled.close()
            plain.close()

    asyncio.run(main())
