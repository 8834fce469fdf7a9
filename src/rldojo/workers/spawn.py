"""Starting a worker's interpreter: its command line, environment, shared memory, output.

`rldojo.workers.process.WorkerProcess` calls `spawn` once per worker. The child is a
fresh interpreter in its own session and process group (killing the group kills what it
started); its stdout and stderr go to the parent's, or to `output`, a log file they are
appended to (a job's `RUN/train.log`), so a worker's prints, warnings and tracebacks land
next to the work they belong to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD_CODE = "import sys; from rldojo.workers.child import main; main(sys.argv[1:])"
"""The child's command line (not ``-m``: this package has imported the module already)."""


def child_environ() -> dict[str, str]:
    """The parent's environment, with rldojo's own location on PYTHONPATH: the child must
    import `rldojo.workers.child` before it gets the parent's ``sys.path`` (that works
    even when rldojo was put on ``sys.path`` at run time, not installed)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # .../src, the folder holding rldojo/
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, root])
    return env


def shared_fd() -> int:
    """A file descriptor of 8 bytes of memory to share with a child."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("rldojo-worker-running")
    else:  # not Linux: an unlinked temporary file does the same
        with tempfile.TemporaryFile() as f:
            fd = os.dup(f.fileno())
    os.ftruncate(fd, 8)
    return fd


def spawn(
    fd: int, mem: int, die_with_parent: bool, output: str | os.PathLike[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the child serving on socket `fd` with running-call memory `mem`; `output`:
    a file its stdout and stderr are appended to (None: the parent's)."""
    args = [str(fd), str(mem), str(os.getpid()), str(int(die_with_parent))]
    log = open(output, "ab") if output is not None else None  # noqa: SIM115 (the child's)
    try:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD_CODE, *args],
            pass_fds=(fd, mem),
            stdin=subprocess.DEVNULL,
            close_fds=True,
            stdout=log,
            stderr=log,
            env=child_environ(),
            start_new_session=True,  # its own group: killed with what it started
        )
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptors
