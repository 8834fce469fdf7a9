"""`sandbox.run` / `run_async` / `SandboxPool`: results, limits, statuses, retries."""

from __future__ import annotations

import asyncio
import time

from rldojo.sandbox import ExecSpec, Limits, SandboxPool


def test_run_returns_output_and_exit_code(pool: SandboxPool) -> None:
    result = pool.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert result.status == "ok"
    assert result.returncode == 3
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.host_uid in pool.uids and result.host_uid != 0
    assert 0 < result.wall_s < 5


def test_stdin_and_files(pool: SandboxPool) -> None:
    code = "import sys\nprint(sys.stdin.read().upper(), open('data.txt').read())"
    result = pool.run(code, stdin="hello", files={"data.txt": "from file"})
    assert result.stdout == "HELLO from file\n"


def test_files_stay_in_the_sandbox(pool: SandboxPool, tmp_path) -> None:
    result = pool.run("open('/work/new.txt', 'w').write('x')\nimport os\nprint(os.getcwd())")
    assert result.stdout == "/work\n"
    assert not (tmp_path / "new.txt").exists()


def test_exception_is_ok_status_with_traceback(pool: SandboxPool) -> None:
    result = pool.run("raise ValueError('boom')")
    assert result.status == "ok" and result.returncode == 1
    assert "ValueError: boom" in result.stderr


def test_run_async_runs_concurrently(pool: SandboxPool) -> None:
    async def main() -> list[str]:
        jobs = [pool.run_async(f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(4)]
        return [r.stdout for r in await asyncio.gather(*jobs)]

    start = time.monotonic()
    outs = asyncio.run(main())
    assert outs == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - start < 4 * 0.3 + 1.0  # two slots in parallel


def test_sandbox_error_is_retried_and_reported(pool: SandboxPool) -> None:
    # A trusted script that never announces its start looks like a broken sandbox.
    result = pool.execute(ExecSpec(script=b"pass\n", limits=Limits(timeout_s=5)))
    assert result.status == "sandbox_error"
    assert result.attempts == pool.retries + 1
    assert "did not start" in result.error


def test_memory_limit_status(pool: SandboxPool, leftovers) -> None:
    result = pool.run("x = bytearray(2 * 1024**3)", memory_mb=256)
    assert result.status == "memory"
    assert leftovers(pool) == []
