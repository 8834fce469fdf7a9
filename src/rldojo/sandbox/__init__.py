"""rldojo.sandbox: isolated execution of untrusted (model-written) code.

Public API::

    run(code, *, stdin=None, files=None, timeout_s=10.0, memory_mb=512, allow_fork=False)
        -> ExecResult
    await run_async(...)                       # same, for async callers
    SandboxPool(size, *, allow_weak=None)      # bounded pool, one host uid per slot
    probe() -> ProbeResult                     # which layers hold here (`rldojo doctor`)

Isolation chain, outermost first (each layer measured by `probe()` on this machine):

1. Parent (root): claims a uid per slot (60000+n), creates the slot's pids/memory cgroup
   where writable, becomes a child subreaper.
2. ``setpriv`` drops to the slot uid (no groups, empty inheritable and bounding
   capability sets, no_new_privs), then execs bubblewrap unprivileged.
3. bubblewrap: new user, pid, net, ipc, uts and cgroup namespaces; ``--disable-userns``;
   ``--cap-drop ALL``; ``--die-with-parent``; ``--new-session``; ``--clearenv``;
   ``--as-pid-1``; read-only binds of only the interpreter, its stdlib and shared
   libraries; ``/proc/sys`` read-only; fresh size-limited tmpfs at /work (cwd) and /tmp;
   ``/`` and ``/dev`` remounted read-only; the base seccomp filter (``--seccomp``).
   For a plain run it also loads the candidate filter (no fork/vfork/non-thread clone
   unless ``allow_fork``); the grading driver installs that filter itself, per test.
4. The trusted launcher (``launcher.py``, run by ``/usr/bin/python3 -I -S``) announces
   start on a private control channel and closes it, lowers rlimits (AS, CPU, NPROC,
   FSIZE, NOFILE, core=0; MALLOC_ARENA_MAX=2 is in the environment), then runs the code
   as ``__main__``.
5. The parent enforces the wall timeout by killing the sandbox's pid 1 (the kernel kills
   the namespace), caps stdout/stderr, and reaps what is left.

See ``seccomp.py`` for the filters, ``runner.py`` for one execution, ``probe.py`` for the
fail-closed policy.
"""

from rldojo.sandbox.pool import SandboxPool, SandboxUnavailable, default_pool, run, run_async
from rldojo.sandbox.probe import ProbeResult, probe
from rldojo.sandbox.spec import ExecResult, ExecSpec, ExecStatus, Limits

__all__ = [
    "ExecResult",
    "ExecSpec",
    "ExecStatus",
    "Limits",
    "ProbeResult",
    "SandboxPool",
    "SandboxUnavailable",
    "default_pool",
    "probe",
    "run",
    "run_async",
]
