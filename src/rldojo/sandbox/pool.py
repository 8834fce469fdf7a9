"""`SandboxPool`: a bounded number of concurrent sandboxes, one host uid per slot.

Both sync (`run`, `execute`) and async (`run_async`, `execute_async`) callers share the
slots; async calls run on the pool's own threads so they never block an event loop (and
never starve the loop's default executor). A `sandbox_error` (the sandbox itself failed:
spawn error, bwrap setup failure, no start marker) is retried; callers see it only after
`retries` more attempts, and graders turn it into `Score.failed("error")`, never a reward.

The module-level `run` / `run_async` use a process-wide default pool sized to the CPUs.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rldojo.sandbox.bwrap import DEFAULT_PYTHON
from rldojo.sandbox.probe import ProbeResult, detect_env, probe
from rldojo.sandbox.runner import execute
from rldojo.sandbox.slots import claim_slot, release_slot
from rldojo.sandbox.spec import ExecResult, ExecSpec, Limits

_SLOT_IDS = itertools.count(1)
_POOLS: weakref.WeakSet[SandboxPool] = weakref.WeakSet()
_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here, or only in a weaker mode that was not allowed."""


def _weak_allowed(explicit: bool | None) -> bool:
    if explicit is not None:
        return explicit
    return os.environ.get("RLDOJO_SANDBOX_ALLOW_WEAK", "") == "1"


def _check_files(files: Mapping[str, str | bytes] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, data in (files or {}).items():
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"sandbox file names must be plain names, got {name!r}")
        out[name] = data.encode() if isinstance(data, str) else bytes(data)
    return out


class SandboxPool:
    """Runs sandboxed executions on at most `size` slots at a time.

    Raises `SandboxUnavailable` at construction when the probe finds no usable sandbox,
    or a weaker one than strict mode while weak mode is not allowed.
    """

    def __init__(
        self,
        size: int | None = None,
        *,
        python: str = DEFAULT_PYTHON,
        allow_weak: bool | None = None,
        retries: int = 2,
        cgroups: bool = True,
    ) -> None:
        self.probe: ProbeResult = probe(python)
        if self.probe.mode == "unavailable":
            raise SandboxUnavailable(self.probe.summary)
        if not self.probe.strict and not _weak_allowed(allow_weak):
            raise SandboxUnavailable(
                "sandbox would run in a weaker mode; pass allow_weak=True or set "
                "RLDOJO_SANDBOX_ALLOW_WEAK=1 to accept it\n" + self.probe.summary
            )
        self.env = detect_env(python)
        self.size = max(1, size or os.cpu_count() or 1)
        self.retries = retries
        self._slots: queue.Queue = queue.Queue()
        self._all_slots = [claim_slot(next(_SLOT_IDS), cgroup=cgroups) for _ in range(self.size)]
        for slot in self._all_slots:
            self._slots.put(slot)
        self._executor = ThreadPoolExecutor(self.size, thread_name_prefix="rldojo-sandbox")
        self._closed = False
        _POOLS.add(self)

    @property
    def uids(self) -> tuple[int | None, ...]:
        return tuple(slot.uid for slot in self._all_slots)

    def execute(self, spec: ExecSpec) -> ExecResult:
        """Run `spec` on a free slot (blocking), retrying sandbox errors."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        slot = self._slots.get()
        try:
            result = execute(spec, self.env, slot)
            attempt = 1
            while result.status == "sandbox_error" and attempt <= self.retries:
                time.sleep(0.05 * attempt)
                result = execute(spec, self.env, slot)
                attempt += 1
        finally:
            self._slots.put(slot)
        if attempt > 1:
            result = _with_attempts(result, attempt)
        return result

    async def execute_async(self, spec: ExecSpec) -> ExecResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.execute, spec)

    def run(
        self,
        code: str,
        *,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        allow_fork: bool = False,
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run Python source `code` as ``__main__`` in /work (blocking)."""
        return self.execute(
            program_spec(code, stdin, files, timeout_s, memory_mb, allow_fork, limits)
        )

    async def run_async(
        self,
        code: str,
        *,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        allow_fork: bool = False,
        limits: Limits | None = None,
    ) -> ExecResult:
        spec = program_spec(code, stdin, files, timeout_s, memory_mb, allow_fork, limits)
        return await self.execute_async(spec)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        for slot in self._all_slots:
            release_slot(slot)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_attempts(result: ExecResult, attempts: int) -> ExecResult:
    return replace(result, attempts=attempts)


def program_spec(
    code: str,
    stdin: str | bytes | None,
    files: Mapping[str, str | bytes] | None,
    timeout_s: float,
    memory_mb: int,
    allow_fork: bool,
    limits: Limits | None = None,
) -> ExecSpec:
    """The `ExecSpec` of a plain program run through the launcher."""
    lim = limits or Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    return ExecSpec(
        script=None,
        limits=lim,
        ro_files={"main.py": code.encode()},
        work_files=_check_files(files),
        stdin=data,
        allow_fork=allow_fork,
    )


def default_pool() -> SandboxPool:
    """The process-wide pool used by `run` / `run_async` (created on first use)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            _default_pool = SandboxPool()
        return _default_pool


def run(
    code: str,
    *,
    stdin: str | bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    allow_fork: bool = False,
) -> ExecResult:
    """Run untrusted Python `code` in the sandbox and return what happened."""
    return default_pool().run(
        code,
        stdin=stdin,
        files=files,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        allow_fork=allow_fork,
    )


async def run_async(
    code: str,
    *,
    stdin: str | bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    allow_fork: bool = False,
) -> ExecResult:
    """Async `run`: waits on the default pool's threads, never on the event loop."""
    return await default_pool().run_async(
        code,
        stdin=stdin,
        files=files,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        allow_fork=allow_fork,
    )


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()
