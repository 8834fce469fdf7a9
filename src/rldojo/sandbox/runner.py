"""Run one `ExecSpec` in bubblewrap as a dropped uid, within its limits; collect the output.

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
3. `rldojo.sandbox.supervise` watches the process: the sandbox's pid 1 from bwrap's
   ``--info-fd``, the cgroup (bwrap waits on ``--block-fd`` until both processes are
   attached), then two limits. Start-up (spawn, namespaces, the interpreter's own
   start) is bounded by ``Limits.startup_timeout_s``; the run's wall-clock limit
   ``Limits.timeout_s`` starts when the launcher writes its start record, which it
   signals with one byte on the started pipe (``launcher.signal_started``). An
   interpreter slow to start on a loaded machine thus costs the program none of its
   time; a sandbox that never starts is a ``sandbox_error`` that says start-up timed
   out. On expiry the whole pid namespace is killed and orphans are reaped.
4. The control channel holds frames ``b"RD" + nonce + len + JSON`` written by trusted
   code only; frames with a wrong nonce end the parse.
"""

from __future__ import annotations

import contextlib
import functools
import json
import marshal
import os
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
from rldojo.sandbox.supervise import ensure_subreaper, supervise

FRAME_MAGIC = b"RD"
_FRAME_HEAD = 2 + 16 + 4
_CONTROL_CAP = 64 << 20


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


def _command_prefix(env: SandboxEnv, slot: Slot) -> list[str]:
    if not (env.drop_uid and slot.uid is not None and env.setpriv):
        return []
    uid = str(slot.uid)
    return [
        env.setpriv,
        "--reuid",
        uid,
        "--regid",
        uid,
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


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
    records: list[dict[str, Any]], timed_out: str | None, rc: int | None, stderr: str, oom: bool
) -> tuple[str, str]:
    """(status, error) of a finished execution; `timed_out` names the limit that expired
    (`start-up: ...` or `run`), None when the sandbox exited by itself."""
    tail = stderr[-400:].strip()
    if timed_out is not None and timed_out.startswith("start-up"):
        return "sandbox_error", timed_out + (f": {tail}" if tail else "")
    if not any(r.get("k") == "start" for r in records):
        return "sandbox_error", "sandbox did not start" + (f": {tail}" if tail else "")
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
    started_r, started_w = fds.pipe()  # a byte when the start record is written
    job = {**spec.job, "limits": spec.limits.for_job(), "allow_fork": spec.allow_fork}
    job.update(control_fd=ctl, nonce_fd=nonce_fd, started_fd=started_w)
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
        bwrap=env.bwrap,
        interp=env.interp,
        limits=spec.limits,
        ro_data=ro_data,
        work_data=work_data,
        seccomp_fds=seccomp_fds,
        info_fd=info_w,
        block_fd=block_r,
        disable_userns=env.disable_userns,
        command=[entry],
    )
    child_side = [fd for fd, _ in ro_data + work_data] + [nonce_fd, info_w, *seccomp_fds]
    child_side += [started_w] + ([block_r] if block_r is not None else [])
    start = time.monotonic()
    oom_before = slot.cgroup.oom_kills() if slot.cgroup else 0
    try:
        proc = _spawn(argv, env, slot, (stdin, out, err), [ctl, *child_side])
    except OSError as exc:
        return ExecResult("sandbox_error", None, "", "", 0.0, error=f"spawn failed: {exc}")
    for fd in child_side:
        fds.close(fd)
    pipes = (info_r, started_r, block_w)
    timed_out, _, host_uid = supervise(proc, slot.cgroup, spec.limits, start, pipes)
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
