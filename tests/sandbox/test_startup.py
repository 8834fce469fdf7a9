"""Start-up has its own bound: the run's wall-clock limit counts from the launcher's start
record, so a slow start (an interpreter starting on a loaded machine) costs the program
none of its time, and a sandbox that never starts fails naming start-up.

The slow start is a trusted entry script that sleeps before it writes the start record:
a controlled delay in the start-up phase, the same for the parent as a slow interpreter."""

from __future__ import annotations

import pytest

from rldojo.sandbox import ExecSpec, Limits, SandboxPool

pytestmark = pytest.mark.slow  # the sandbox: processes

GENEROUS_S = 60.0  # a bound that is not under test


def _starts_after(delay_s: float, then: str = "print('ran')") -> bytes:
    """An entry script whose start-up takes `delay_s`, then runs `then` (trusted code)."""
    return f"""
import sys, time
sys.path.insert(0, "/rldojo")
import launcher
job = launcher.load_job()
nonce = launcher.read_nonce(job["nonce_fd"])
time.sleep({delay_s})
launcher.emit_raw(job["control_fd"], nonce, launcher.START_RECORD)
{then}
""".encode()


def test_a_start_up_longer_than_the_run_limit_still_runs(pool: SandboxPool) -> None:
    limits = Limits(timeout_s=1.0, startup_timeout_s=GENEROUS_S)
    result = pool.execute(ExecSpec(script=_starts_after(3.0), limits=limits))
    assert (result.status, result.error, result.stdout) == ("ok", "", "ran\n")
    assert result.attempts == 1
    assert result.wall_s >= 3.0  # the start-up really outlasted the run's limit


def test_the_run_limit_counts_from_the_start_record(pool: SandboxPool, leftovers) -> None:
    limits = Limits(timeout_s=1.0, startup_timeout_s=GENEROUS_S)
    spec = ExecSpec(script=_starts_after(2.0, "time.sleep(3600)"), limits=limits)
    result = pool.execute(spec)
    assert result.status == "timeout"  # the program's own limit, not start-up's
    assert result.wall_s >= 2.0 + 1.0  # start-up, then the full run limit
    assert leftovers(pool) == []


def test_a_start_up_beyond_its_bound_fails_naming_start_up(pool: SandboxPool, leftovers) -> None:
    limits = Limits(timeout_s=GENEROUS_S, startup_timeout_s=1.0)
    result = pool.execute(ExecSpec(script=_starts_after(3600.0), limits=limits))
    assert result.status == "sandbox_error"  # the sandbox failed, not the program
    assert result.error.startswith("start-up timed out: no start record within")
    assert "startup_timeout_s=1s" in result.error
    assert result.attempts == pool.retries + 1  # infrastructure: retried by the pool
    assert result.wall_s < GENEROUS_S  # killed at the start-up bound, not the run's
    assert leftovers(pool) == []
