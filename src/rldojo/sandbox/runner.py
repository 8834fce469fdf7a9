"""Run one `ExecSpec` in bubblewrap as a dropped uid, enforce the wall timeout, collect output.

The chain for one execution (parent side):

1. Everything the sandbox receives goes through anonymous memfds: the entry script, the
   launcher, job.json and the candidate filter (``--ro-bind-data``), writable work files
   (``--file``), stdin, the base seccomp filter (``--seccomp``), the per-run nonce and the
   control channel. stdout/stderr are memfds too, so a flood never blocks and is bounded
   by RLIMIT_FSIZE; we read back at most ``output_cap`` bytes of each.
2. ``setpriv --reuid/--regid U --clear-groups --inh-caps=-all --bounding-set=-all
   --no-new-privs`` drops root to the slot's uid, then execs bwrap, which unshares all
   namespaces unprivileged. (setpriv instead of ``Popen(user=...)`` keeps the spawn a
   vfork, cheap even from a trainer process with a multi-GB heap.)
3. bwrap reports the sandbox's pid-1 on ``--info-fd``; when the slot has a cgroup, bwrap
   waits on ``--block-fd`` until both processes are attached.
4. On timeout the parent SIGKILLs the sandbox's pid 1 (the kernel then kills the whole
   pid namespace), then the bwrap process group. This process is a child subreaper, so
   a pid-1 orphaned by a killed bwrap comes back to us and is reaped by pid (zombies
   would otherwise count against the slot uid's process budget).
5. The control channel holds frames ``b"RD" + nonce + len + JSON`` written by trusted
   code only; frames with a wrong nonce end the parse.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import marshal
import os
import select
import signal
import struct
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from rldojo.sandbox import seccomp
from rldojo.sandbox.bwrap import Interpreter, build_argv
from rldojo.sandbox.cgroups import SlotCgroup
from rldojo.sandbox.spec import ExecResult, ExecSpec

FRAME_MAGIC = b"RD"
_FRAME_HEAD = 2 + 16 + 4
_CONTROL_CAP = 64 << 20
_PR_SET_CHILD_SUBREAPER = 36
_subreaper_set = False


@dataclass(frozen=True)
class SandboxEnv:
    """What this machine supports, decided once by the probe."""

    bwrap: str
    interp: Interpreter
    seccomp: bool
    disable_userns: bool
    setpriv: str | None
    drop_uid: bool


@dataclass
class Slot:
    """One worker slot of a pool: its own host uid and, where possible, its own cgroup."""

    index: int
    uid: int | None
    cgroup: SlotCgroup | None = None
    lock_fd: int | None = field(default=None, repr=False)


@functools.cache
def launcher_source() -> bytes:
    return resources.files("rldojo.sandbox").joinpath("launcher.py").read_bytes()


def ensure_subreaper() -> None:
    """Make this process a child subreaper (once): orphaned sandbox inits come back to us."""
    global _subreaper_set
    if not _subreaper_set:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        _subreaper_set = True


class _Fds:
    """Descriptors of one execution, closed together."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def memfd(self, name: str, data: bytes = b"") -> int:
        fd = os.memfd_create(f"rldojo-{name}", os.MFD_CLOEXEC)
        self.fds.append(fd)
        if data:
            os.pwrite(fd, data, 0)  # offset stays 0: bwrap reads from the start
        return fd

    def pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self.fds += [r, w]
        return r, w

    def close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.remove(fd)
            os.close(fd)

    def close_all(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def parse_frames(data: bytes, nonce: bytes) -> list[dict[str, Any]]:
    """Authenticated records of the control channel; stops at the first bad frame."""
    records: list[dict[str, Any]] = []
    pos = 0
    while pos + _FRAME_HEAD <= len(data):
        if data[pos : pos + 2] != FRAME_MAGIC or data[pos + 2 : pos + 18] != nonce:
            break
        (size,) = struct.unpack_from("<I", data, pos + 18)
        payload = data[pos + _FRAME_HEAD : pos + _FRAME_HEAD + size]
        if len(payload) < size:
            break
        try:
            record = json.loads(payload)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        records.append(record)
        pos += _FRAME_HEAD + size
    return records


def _read_capped(fd: int, cap: int) -> tuple[str, bool]:
    data = os.pread(fd, cap + 1, 0)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


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


def _command_prefix(env: SandboxEnv, slot: Slot) -> list[str]:
    if not (env.drop_uid and slot.uid is not None and env.setpriv):
        return []
    uid = str(slot.uid)
    return [
        env.setpriv, "--reuid", uid, "--regid", uid, "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
    ]  # fmt: skip


def _spawn(
    argv: list[str], env: SandboxEnv, slot: Slot, stdio: tuple[int, int, int], keep: list[int]
) -> subprocess.Popen[bytes]:
    extra: dict[str, Any] = {}
    if env.drop_uid and slot.uid is not None and not env.setpriv:
        extra = {"user": slot.uid, "group": slot.uid, "extra_groups": []}
    return subprocess.Popen(
        _command_prefix(env, slot) + argv,
        stdin=stdio[0],
        stdout=stdio[1],
        stderr=stdio[2],
        pass_fds=keep,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin"},
        **extra,
    )


def _classify(
    records: list[dict[str, Any]], timed_out: bool, rc: int | None, stderr: str, oom: bool
) -> tuple[str, str]:
    """(status, error) of a finished execution."""
    if not any(r.get("k") == "start" for r in records):
        why = "timed out before the sandbox started" if timed_out else "sandbox did not start"
        return "sandbox_error", f"{why}: {stderr[-400:]}".strip()
    if timed_out:
        return "timeout", ""
    if oom or "MemoryError" in stderr[-2000:].strip().rsplit("\n", 1)[-1]:
        return "memory", ""
    if rc is not None and rc > 128 and rc - 128 in (signal.SIGXCPU, signal.SIGKILL):
        return ("timeout" if rc - 128 == signal.SIGXCPU else "killed"), ""
    if rc is not None and rc > 128 and rc - 128 < 65:
        return "killed", ""
    return "ok", ""


def execute(spec: ExecSpec, env: SandboxEnv, slot: Slot) -> ExecResult:
    """Run `spec` once in slot `slot` (no retries; see `SandboxPool`)."""
    ensure_subreaper()
    fds = _Fds()
    try:
        return _execute(spec, env, slot, fds)
    finally:
        fds.close_all()


def _execute(spec: ExecSpec, env: SandboxEnv, slot: Slot, fds: _Fds) -> ExecResult:
    nonce = os.urandom(16)
    out, err, ctl = fds.memfd("stdout"), fds.memfd("stderr"), fds.memfd("control")
    stdin, nonce_fd = fds.memfd("stdin", spec.stdin), fds.memfd("nonce", nonce)
    job = {**spec.job, "limits": spec.limits.for_job(), "allow_fork": spec.allow_fork}
    job.update(control_fd=ctl, nonce_fd=nonce_fd)
    ro = {"launcher.py": launcher_source(), "job.marshal": marshal.dumps(job, 4)}
    if spec.script is not None:
        ro["entry.py"] = spec.script
    ro.update(spec.ro_files)
    entry = "/rldojo/entry.py" if spec.script is not None else "/rldojo/launcher.py"
    filters: list[bytes] = []
    if env.seccomp:
        filters.append(seccomp.base_program())
        if spec.self_filtering:
            ro["candidate.bpf"] = seccomp.candidate_program(spec.allow_fork)
        elif not spec.allow_fork:
            filters.append(seccomp.candidate_program(False, block_exec=False))
    ro_data = [(fds.memfd(name, data), f"/rldojo/{name}") for name, data in ro.items()]
    work_data = [(fds.memfd("work", data), f"/work/{n}") for n, data in spec.work_files.items()]
    seccomp_fds = [fds.memfd("seccomp", program) for program in filters]
    info_r, info_w = fds.pipe()
    block_r, block_w = fds.pipe() if slot.cgroup else (None, None)
    argv = build_argv(
        bwrap=env.bwrap, interp=env.interp, limits=spec.limits, ro_data=ro_data,
        work_data=work_data, seccomp_fds=seccomp_fds, info_fd=info_w, block_fd=block_r,
        disable_userns=env.disable_userns, command=[entry],
    )  # fmt: skip
    child_side = [fd for fd, _ in ro_data + work_data] + [nonce_fd, info_w, *seccomp_fds]
    child_side += [block_r] if block_r is not None else []
    start = time.monotonic()
    deadline = start + spec.limits.timeout_s
    oom_before = slot.cgroup.oom_kills() if slot.cgroup else 0
    try:
        proc = _spawn(argv, env, slot, (stdin, out, err), [ctl, *child_side])
    except OSError as exc:
        return ExecResult("sandbox_error", None, "", "", 0.0, error=f"spawn failed: {exc}")
    for fd in child_side:
        fds.close(fd)
    timed_out, _, host_uid = _supervise(proc, slot, spec, deadline, info_r, block_w)
    wall = time.monotonic() - start
    size = min(os.fstat(ctl).st_size, _CONTROL_CAP)
    records = parse_frames(os.pread(ctl, size, 0), nonce)
    stdout, out_trunc = _read_capped(out, spec.limits.output_cap)
    stderr, err_trunc = _read_capped(err, spec.limits.output_cap)
    oom = bool(slot.cgroup and slot.cgroup.oom_kills() > oom_before)
    rc = None if timed_out else proc.returncode
    status, error = _classify(records, timed_out, rc, stderr, oom)
    return ExecResult(
        status,  # type: ignore[arg-type]
        rc,
        stdout,
        stderr,
        wall,
        out_trunc,
        err_trunc,
        tuple(records),
        error,
        host_uid=host_uid,
    )


def _supervise(
    proc: subprocess.Popen[bytes],
    slot: Slot,
    spec: ExecSpec,
    deadline: float,
    info_r: int,
    block_w: int | None,
) -> tuple[bool, int | None, int | None]:
    """Attach to the cgroup, release the sandbox, wait: (timed_out, pid 1, its host uid)."""
    child_pid = _read_info(info_r, deadline)
    host_uid = _host_uid(child_pid)
    if slot.cgroup is not None and block_w is not None:
        limits = spec.limits
        pids = limits.nproc + 4
        memory = (limits.memory_mb * 2 + limits.disk_mb + 16 + 64) << 20
        try:
            slot.cgroup.configure(pids, memory)
            slot.cgroup.attach(proc.pid)
            if child_pid is not None:
                slot.cgroup.attach(child_pid)
        except OSError:
            pass  # the process already exited; the run reports what happened
        with contextlib.suppress(OSError):
            os.write(block_w, b"go")
    if _wait_exit(proc, deadline):
        return False, child_pid, host_uid
    _kill(proc, child_pid)
    return True, child_pid, host_uid


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
