"""Plain data of the sandbox: what to run (`ExecSpec`), within which limits (`Limits`),
and what came back (`ExecResult`).

`ExecSpec` is the low-level form used by graders: a trusted entry script plus files. The
user-facing `rldojo.sandbox.run(code, ...)` builds one around the launcher.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ExecStatus = Literal["ok", "timeout", "memory", "killed", "sandbox_error"]
"""`ok`: the program ran to its end (any exit code). `timeout`: wall or CPU limit.
`memory`: it ran out of its memory limit. `killed`: a signal or an output/file limit.
`sandbox_error`: the sandbox itself failed (retried by the pool; never a reward)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed execution."""

    timeout_s: float = 10.0
    """Wall-clock limit of the run, counted from the launcher's start record; the parent
    kills the whole sandbox (pid namespace) when it expires (then the status is `timeout`)."""
    startup_timeout_s: float = 30.0
    """Bound on start-up: from the spawn to the start record (bubblewrap, namespaces, the
    interpreter's own start). Separate from `timeout_s` so that an interpreter slow to
    start on a loaded machine costs the program none of its time; start-up normally
    takes well under a second, so only a machine in trouble reaches this. A sandbox that
    does not start within it is a `sandbox_error` that names start-up (retried by the pool)."""
    memory_mb: int = 512
    """RLIMIT_AS of each sandboxed process, and the cgroup memory limit where available."""
    nproc: int = 32
    """RLIMIT_NPROC (processes + threads of the sandbox uid); pids.max in a cgroup."""
    fsize_mb: int = 16
    """RLIMIT_FSIZE: the largest file (stdout/stderr included) a process may write."""
    disk_mb: int = 64
    """Size of the tmpfs mounted as the working directory /work (/tmp gets 16 MiB)."""
    nofile: int = 256
    """RLIMIT_NOFILE."""
    output_cap: int = 1 << 20
    """Bytes of stdout and of stderr returned to the caller (the rest is dropped)."""

    @property
    def cpu_s(self) -> int:
        return max(1, math.ceil(self.timeout_s)) + 1

    def for_job(self) -> dict[str, Any]:
        """The limits as the in-sandbox launcher reads them."""
        return {**asdict(self), "cpu_s": self.cpu_s}


@dataclass(frozen=True)
class ExecSpec:
    """One sandboxed execution.

    `script` is the trusted entry point (run as ``/rldojo/entry.py``); `ro_files` land
    read-only under ``/rldojo/``; `work_files` are writable copies under ``/work``
    (the working directory); `job` is merged into ``/rldojo/job.marshal``.

    `self_filtering`: the entry script forks the processes that run candidate code and
    installs the candidate seccomp filter in them itself (from ``/rldojo/candidate.bpf``);
    otherwise bubblewrap loads that filter for the whole sandbox.
    """

    script: bytes | None = None
    """Source of the entry script; None runs the launcher itself (a plain program run)."""
    limits: Limits = field(default_factory=Limits)
    ro_files: Mapping[str, bytes] = field(default_factory=dict)
    work_files: Mapping[str, bytes] = field(default_factory=dict)
    stdin: bytes = b""
    job: Mapping[str, Any] = field(default_factory=dict)
    allow_fork: bool = False
    self_filtering: bool = False


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one sandboxed execution.

    `records` are the control-channel records written by the trusted launcher/driver,
    already authenticated with the run's nonce (the candidate never held the channel).
    `returncode` is the interpreter's exit status as bubblewrap reports it (128+N for a
    signal N); None when there is none (timeout, sandbox failure).
    """

    status: ExecStatus
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    records: tuple[Mapping[str, Any], ...] = ()
    error: str = ""
    host_uid: int | None = None
    """Host uid of the sandbox's pid 1, read by the parent while it ran (evidence)."""
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status == "ok"
