"""Capability probe: which isolation layers actually hold on this machine.

`probe()` runs one tiny sandbox with every layer this machine should support and checks
each from the inside (what the code sees) and the outside (host uid, cgroup). The pool
refuses to start in a weaker mode unless explicitly allowed (``allow_weak=True`` or
``RLDOJO_SANDBOX_ALLOW_WEAK=1``); there is no mode without bubblewrap at all.
``rldojo doctor`` prints `ProbeResult.summary`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, fields
from typing import Any

from rldojo.sandbox import seccomp
from rldojo.sandbox.bwrap import (
    DEFAULT_PYTHON,
    SandboxSetupError,
    bwrap_version,
    discover_interpreter,
    find_bwrap,
)
from rldojo.sandbox.runner import SandboxEnv, execute
from rldojo.sandbox.spec import ExecSpec, Limits

_PROBE_SCRIPT = rb"""
import ctypes, errno, os, socket, sys
sys.path.insert(0, "/rldojo")
import launcher
job = launcher.load_job()
nonce = launcher.read_nonce(job["nonce_fd"])
ctl = job["control_fd"]
launcher.emit_raw(ctl, nonce, launcher.START_RECORD)
libc = ctypes.CDLL(None, use_errno=True)
def fails(fn):
    try:
        fn()
    except OSError:
        return True
    return False
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
facts = {
    "uid_map_lines": len(open("/proc/self/uid_map").read().strip().splitlines()),
    "cap_eff": int(status("CapEff"), 16), "cap_bnd": int(status("CapBnd"), 16),
    "seccomp_mode": status("Seccomp"), "no_new_privs": status("NoNewPrivs"),
    "pid": os.getpid(), "hostname": socket.gethostname(),
    "netdevs": [l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]],
    "inet_blocked": fails(lambda: socket.socket(socket.AF_INET)),
    "unshare_blocked": libc.unshare(0x10000000) != 0,
    "proc_sys_ro": fails(lambda: open("/proc/sys/kernel/hostname", "w").write("x")),
    "root_ro": fails(lambda: open("/probe", "w")),
    "host_hidden": not any(os.path.exists(p) for p in ("/etc/shadow", "/root", "/home")),
}
launcher.apply_limits(job["limits"])
import resource
facts["nproc_limit"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
facts["fork_blocked"] = fails(os.fork)
launcher.emit(ctl, nonce, {"k": "probe", "facts": facts})
"""


@dataclass(frozen=True)
class ProbeResult:
    """Per-layer results of the probe. `strict` is True when every required layer holds."""

    bwrap: bool
    user_namespace: bool
    pid_namespace: bool
    net_namespace: bool
    uts_namespace: bool
    uid_dropped: bool
    no_capabilities: bool
    seccomp: bool
    process_creation_blocked: bool
    nested_namespaces_blocked: bool
    rlimits: bool
    readonly_root: bool
    proc_sys_readonly: bool
    host_hidden: bool
    cgroup: bool
    interpreter: str = ""
    bwrap_path: str = ""
    problems: tuple[str, ...] = ()

    OPTIONAL = ("cgroup",)

    def layers(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "bool"}

    @property
    def strict(self) -> bool:
        return all(ok for name, ok in self.layers().items() if name not in self.OPTIONAL)

    @property
    def usable(self) -> bool:
        """Weak mode is possible at all (bwrap runs code in fresh namespaces)."""
        return self.bwrap and self.user_namespace and self.pid_namespace

    @property
    def mode(self) -> str:
        return "strict" if self.strict else ("weak" if self.usable else "unavailable")

    @property
    def summary(self) -> str:
        lines = [f"sandbox: {self.mode} (interpreter {self.interpreter or '?'})"]
        for name, ok in self.layers().items():
            note = " (optional)" if name in self.OPTIONAL else ""
            lines.append(f"  [{'x' if ok else ' '}] {name.replace('_', ' ')}{note}")
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)


def _unavailable(problem: str, **known: Any) -> ProbeResult:
    flags = {f.name: False for f in fields(ProbeResult) if f.type == "bool"}
    return ProbeResult(**{**flags, **known, "problems": (problem,)})


def detect_env(python: str = DEFAULT_PYTHON) -> SandboxEnv:
    """What the runner should use on this machine (before verifying it works)."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxSetupError("bubblewrap (bwrap) is not installed")
    root = os.geteuid() == 0
    return SandboxEnv(
        bwrap=bwrap,
        interp=discover_interpreter(python),
        seccomp=seccomp.available(),
        disable_userns=bwrap_version(bwrap) >= (0, 8),
        setpriv=shutil.which("setpriv") if root else None,
        drop_uid=root,
    )


def _from_facts(
    env: SandboxEnv, facts: dict[str, Any], host_uid: int | None, cgroup: bool
) -> ProbeResult:
    result = ProbeResult(
        bwrap=True,
        user_namespace=facts["uid_map_lines"] == 1,
        pid_namespace=facts["pid"] == 1,
        net_namespace=facts["netdevs"] == ["lo"],
        uts_namespace=facts["hostname"] == "sandbox",
        uid_dropped=host_uid is not None and host_uid != 0,
        no_capabilities=facts["cap_eff"] == 0 and facts["cap_bnd"] == 0,
        seccomp=facts["seccomp_mode"] == "2" and facts["inet_blocked"],
        process_creation_blocked=bool(facts["fork_blocked"]),
        nested_namespaces_blocked=bool(facts["unshare_blocked"]),
        rlimits=facts["nproc_limit"] == Limits().nproc,
        readonly_root=bool(facts["root_ro"]),
        proc_sys_readonly=bool(facts["proc_sys_ro"]),
        host_hidden=bool(facts["host_hidden"]),
        cgroup=cgroup,
        interpreter=f"{env.interp.executable} ({env.interp.version})",
        bwrap_path=env.bwrap,
    )
    missing = [n for n, ok in result.layers().items() if not ok and n not in result.OPTIONAL]
    problems = [f"layer not effective: {n}" for n in missing]
    if not env.seccomp:
        problems.append("pyseccomp/libseccomp not importable: no seccomp filter")
    return ProbeResult(**{**result.__dict__, "problems": tuple(problems)})


@functools.cache
def probe(python: str = DEFAULT_PYTHON) -> ProbeResult:
    """Run the capability probe once per interpreter (cached for the process)."""
    from rldojo.sandbox.slots import claim_slot, release_slot

    try:
        env = detect_env(python)
    except (SandboxSetupError, OSError, subprocess.SubprocessError) as exc:
        return _unavailable(str(exc), bwrap=find_bwrap() is not None)
    slot = claim_slot(0, cgroup=True)
    try:
        spec = ExecSpec(script=_PROBE_SCRIPT, limits=Limits(timeout_s=20.0))
        result = execute(spec, env, slot)
    finally:
        has_cgroup = slot.cgroup is not None
        release_slot(slot)
    facts = next((r["facts"] for r in result.records if r.get("k") == "probe"), None)
    if facts is None:
        why = result.error or result.stderr[-400:] or result.status
        return _unavailable(f"probe sandbox failed: {why}", bwrap=True)
    return _from_facts(env, facts, result.host_uid, has_cgroup)
