"""The parent's watch over one sandboxed process: from the spawn to its exit or kill.

`supervise` reads the sandbox's pid 1 from bubblewrap's ``--info-fd``, attaches both
processes to the slot's cgroup and releases the sandbox (``--block-fd``), then enforces
two separate limits: start-up (spawn to the launcher's start record, whose byte arrives
on the started pipe) within `Limits.startup_timeout_s`, and the run within
`Limits.timeout_s` counted from that start record. On expiry it SIGKILLs the sandbox's
pid 1 (the kernel then kills the whole pid namespace), then the bwrap process group.
This process is a child subreaper (`ensure_subreaper`), so a pid 1 orphaned by a killed
bwrap comes back to us and is reaped by pid (zombies would otherwise count against the
slot uid's process budget).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import time

from rldojo.sandbox.cgroups import SlotCgroup
from rldojo.sandbox.spec import Limits

__all__ = ["ensure_subreaper", "supervise"]

_PR_SET_CHILD_SUBREAPER = 36
_subreaper_set = False


def ensure_subreaper() -> None:
    """Make this process a child subreaper (once): orphaned sandbox inits come back to us."""
    global _subreaper_set
    if not _subreaper_set:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _subreaper_set = True


def _read_info(fd: int, deadline: float) -> int | None:
    """The host pid of the sandbox's pid 1, from bwrap's --info-fd (None if bwrap died)."""
    chunks = b""
    while b"}" not in chunks:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        chunks += chunk
    try:
        return int(json.loads(chunks)["child-pid"])
    except (ValueError, KeyError):
        return None


def _host_uid(pid: int | None) -> int | None:
    """Real uid of a host process (the sandbox's pid 1 as the host sees it)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _reap_orphan(pid: int) -> None:
    """Reap `pid` if it was re-parented to us (we are a subreaper) after bwrap died."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return
    if ppid == os.getpid():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _kill(proc: subprocess.Popen[bytes], child_pid: int | None) -> None:
    if child_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)  # pid 1 of the namespace: all of it dies
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if child_pid is not None:
        _reap_orphan(child_pid)


def supervise(
    proc: subprocess.Popen[bytes],
    cgroup: SlotCgroup | None,
    limits: Limits,
    spawned: float,
    pipes: tuple[int, int, int | None],
) -> tuple[str | None, int | None, int | None]:
    """Attach to the cgroup, release the sandbox, wait for its start record within the
    start-up bound, then for its exit within the run's limit counted from the start.
    `pipes`: bwrap's info pipe, the started pipe, the cgroup block pipe (read, read,
    write). Returns (the limit that expired: None, "run" or "start-up timed out: why";
    the sandbox's pid 1; its host uid)."""
    info_r, started_r, block_w = pipes
    startup_deadline = spawned + limits.startup_timeout_s
    child_pid = _read_info(info_r, startup_deadline)
    host_uid = _host_uid(child_pid)
    if cgroup is not None and block_w is not None:
        pids = limits.nproc + 4
        memory = (limits.memory_mb * 2 + limits.disk_mb + 16 + 64) << 20
        try:
            cgroup.configure(pids, memory)
            cgroup.attach(proc.pid)
            if child_pid is not None:
                cgroup.attach(child_pid)
        except OSError:
            pass  # the process already exited; the run reports what happened
        with contextlib.suppress(OSError):
            os.write(block_w, b"go")
    started = _wait_start(started_r, startup_deadline)
    deadline = startup_deadline if started is None else started + limits.timeout_s
    if _wait_exit(proc, deadline):
        return None, child_pid, host_uid
    _kill(proc, child_pid)
    if started is None:
        why = f"no start record within startup_timeout_s={limits.startup_timeout_s:g}s"
        return f"start-up timed out: {why}", child_pid, host_uid
    return "run", child_pid, host_uid


def _wait_start(started_r: int, deadline: float) -> float | None:
    """When the start record was written (monotonic): its byte on the started pipe. None
    when the pipe closed without it (every process holding it is gone) or `deadline`
    passed first."""
    ready, _, _ = select.select([started_r], [], [], max(0.0, deadline - time.monotonic()))
    if ready and os.read(started_r, 1):
        return time.monotonic()
    return None


def _wait_exit(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for `proc` until `deadline` on a pidfd (Popen.wait(timeout) polls with sleeps)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or a kernel without pidfd
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        ready, _, _ = select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(pidfd)
    if not ready:
        return False
    proc.wait()
    return True
