"""Fixtures of the sandbox tests: one strict pool for the module, leftover checks.

When CI=true the strict sandbox is required (a weaker one fails the run); elsewhere the
tests skip on machines where bubblewrap cannot run in strict mode.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from rldojo.sandbox import SandboxPool, probe
from rldojo.sandbox.slots import processes_of_uid


def require_strict() -> None:
    result = probe()
    if result.strict:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("CI requires the strict sandbox:\n" + result.summary)
    pytest.skip("strict sandbox unavailable here:\n" + result.summary)


@pytest.fixture
def strict() -> None:
    """Skip (or, under CI=true, fail) unless the strict sandbox works here."""
    require_strict()


@pytest.fixture(scope="session")
def pool() -> Iterator[SandboxPool]:
    require_strict()
    with SandboxPool(2) as p:
        yield p


def _leftovers(pool: SandboxPool, wait_s: float = 30.0) -> list[int]:
    """Pids still running as the pool's uids after up to `wait_s` (the kernel reaps a dead
    sandbox's processes asynchronously; a loaded machine may take a while). The hostile
    programs that leave processes behind keep them for an hour, far longer."""
    deadline = time.monotonic() + wait_s
    while True:
        found = [pid for uid in pool.uids if uid is not None for pid in processes_of_uid(uid)]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture
def leftovers() -> Callable[[SandboxPool], list[int]]:
    """`leftovers(pool)`: host pids still running as one of the pool's sandbox uids."""
    return _leftovers
