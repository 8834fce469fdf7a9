"""Trusted launcher that runs *inside* the sandbox, before any untrusted code.

This file is shipped into every sandbox as ``/rldojo/launcher.py`` (bubblewrap
``--ro-bind-data``) and executed by the sandbox interpreter (``/usr/bin/python3``). It
must therefore use the standard library only and must not import rldojo.

It holds the in-sandbox half of the isolation chain (see ``rldojo.sandbox``):

- ``apply_limits``: rlimits (address space, CPU, processes, file size, open files,
  core = 0). Lowering limits needs no privilege, and the candidate cannot raise them.
- ``install_filter``: loads the candidate seccomp filter (compiled to BPF by the
  parent with pyseccomp) with ``prctl(PR_SET_SECCOMP)``; bubblewrap already set
  ``no_new_privs`` and loaded the base filter, so this one stacks on top.
- ``set_dumpable(False)``: makes a trusted process's ``/proc/<pid>/{fd,mem,environ}``
  unreadable to same-uid processes (the grading driver uses it).
- ``main``: the plain ``sandbox.run`` mode: announce start on the control channel,
  close it, lower limits and run ``/rldojo/main.py`` as ``__main__`` (in this mode
  bubblewrap itself loads the candidate filter).

The start record ends start-up: writing it (``emit_raw``, whichever entry script does)
also writes one byte on the job's ``started_fd`` pipe and closes it, and the parent
starts the run's wall-clock limit when that byte arrives (until then the separate
start-up bound applies; see ``rldojo.sandbox.spec.Limits``).

Startup cost matters (a trivial run should cost little more than ``python3 -c pass``):
the plain path imports only builtin modules (marshal, resource, _signal), never json,
ctypes or runpy, which would pull in re/enum/collections at several milliseconds.
"""

import marshal
import os
import resource
import sys

JOB_PATH = "/rldojo/job.marshal"
FILTER_PATH = "/rldojo/candidate.bpf"
FRAME_MAGIC = b"RD"
START_RECORD = b'{"k":"start"}'
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_MIB = 1024 * 1024
_started_fd = None  # the job's started pipe until the start record is written (load_job)


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def load_job():
    """The job description the parent wrote for this run (limits, fds, mode)."""
    global _started_fd
    with open(JOB_PATH, "rb") as fh:
        job = marshal.loads(fh.read())
    _started_fd = job.get("started_fd")
    return job


def read_nonce(fd):
    """Read the per-run nonce into a bytearray (never a bytes copy) and close its fd."""
    nonce = bytearray(16)
    os.readv(fd, [nonce])
    os.close(fd)
    return nonce


def emit_raw(fd, nonce, payload):
    """Write one framed record on the control channel: magic, nonce, length, JSON bytes.
    The start record also tells the parent that start-up is over (`signal_started`)."""
    os.writev(fd, [FRAME_MAGIC, nonce, len(payload).to_bytes(4, "little"), payload])
    if payload == START_RECORD:
        signal_started()


def signal_started():
    """One byte on the started pipe, then close it: the parent starts the run's clock.
    Closed before any untrusted code runs, so that code cannot hold it."""
    global _started_fd
    fd, _started_fd = _started_fd, None
    if fd is None:
        return
    try:
        os.write(fd, b"s")
    except OSError:  # the parent gave up on this run already
        pass
    finally:
        os.close(fd)


def emit(fd, nonce, record):
    import json

    emit_raw(fd, nonce, json.dumps(record, separators=(",", ":")).encode("utf-8"))


def set_dumpable(flag):
    ctypes, libc = _libc()
    if libc.prctl(_PR_SET_DUMPABLE, 1 if flag else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def apply_limits(limits):
    """Lower the rlimits of this process (inherited by everything it starts)."""
    pairs = [
        (resource.RLIMIT_AS, int(limits["memory_mb"]) * _MIB),
        (resource.RLIMIT_CPU, int(limits["cpu_s"])),
        (resource.RLIMIT_NPROC, int(limits["nproc"])),
        (resource.RLIMIT_FSIZE, int(limits["fsize_mb"]) * _MIB),
        (resource.RLIMIT_NOFILE, int(limits["nofile"])),
        (resource.RLIMIT_CORE, 0),
    ]
    for kind, value in pairs:
        _, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        # CPU: a soft limit sends SIGXCPU, the hard limit one second later SIGKILL.
        hard_value = value + 1 if kind == resource.RLIMIT_CPU else value
        if hard != resource.RLIM_INFINITY:
            hard_value = min(hard_value, hard)
        resource.setrlimit(kind, (value, hard_value))


def load_filter(path=FILTER_PATH):
    """Prepare the candidate filter for `install_filter` (None in weak mode without one)."""
    try:
        with open(path, "rb") as fh:
            program = fh.read()
    except FileNotFoundError:
        return None
    ctypes, libc = _libc()

    class SockFprog(ctypes.Structure):  # type: ignore[name-defined]
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    buf = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    return (ctypes, libc, prog, buf)


def install_filter(prepared):
    """Stack a prepared candidate seccomp filter on this process (no_new_privs is set)."""
    if prepared is None:
        return False
    ctypes, libc, prog, _buf = prepared
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True


def ignore_sigxfsz():
    """Oversize writes then fail with EFBIG instead of killing the process."""
    import _signal

    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)


def install_site_builtins():
    """``exit``/``quit``/``help`` as ``site`` would add them (we run ``python3 -I -S``:
    the sandbox has no site-packages, and skipping ``site`` saves startup time)."""
    import _sitebuiltins
    import builtins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()


def run_main(path):
    """Run `path` as the ``__main__`` module (what ``python3 path`` would do)."""
    with open(path, "rb") as fh:
        source = fh.read()
    module = type(sys)("__main__")
    module.__file__ = path
    module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = module
    sys.argv = [path]
    sys.path.insert(0, "/work")
    exec(compile(source, path, "exec"), module.__dict__)


def main():
    job = load_job()
    nonce = read_nonce(job["nonce_fd"])
    emit_raw(job["control_fd"], nonce, START_RECORD)
    # After this the process holds nothing trusted: the channel and nonce are gone.
    os.close(job["control_fd"])
    nonce[:] = bytes(len(nonce))
    apply_limits(job["limits"])
    ignore_sigxfsz()
    install_site_builtins()
    run_main("/rldojo/main.py")


if __name__ == "__main__":
    main()
