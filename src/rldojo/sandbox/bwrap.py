"""The bubblewrap command line: namespaces, the read-only view of the interpreter, tmpfs.

The sandbox sees only what the interpreter needs, read-only: the interpreter binary, its
standard library, the directories of the shared objects it maps (found by asking the
interpreter itself), and the merged-/usr symlinks. No /etc, no home, no repository, no
site-packages. /work (the working directory) and /tmp are fresh size-limited tmpfs; / and
/dev are remounted read-only so nothing else can be filled.

The interpreter must be readable by the dropped uid: ``/usr/bin/python3`` (or another
system Python outside a 0700 home such as pyenv's under /root).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from rldojo.sandbox.spec import Limits

DEFAULT_PYTHON = "/usr/bin/python3"
SCRATCH_TMP_MB = 16

_DISCOVER = r"""
import json, os, sys, sysconfig
import ctypes, decimal, hashlib, json, math, random, select, socket, struct, zlib  # noqa
paths = sysconfig.get_paths()
maps = set()
with open("/proc/self/maps") as fh:
    for line in fh:
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/"):
            maps.add(parts[5])
print(json.dumps({"stdlib": paths["stdlib"], "platstdlib": paths["platstdlib"],
                  "executable": os.path.realpath(sys.executable),
                  "version": "%d.%d.%d" % sys.version_info[:3], "maps": sorted(maps)}))
"""


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter as the sandbox sees it: its path and the host dirs to bind."""

    executable: str
    version: str
    ro_dirs: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]


class SandboxSetupError(RuntimeError):
    """The sandbox cannot be built on this machine (missing bwrap, unusable interpreter)."""


def find_bwrap() -> str | None:
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None
    )


@functools.cache
def bwrap_version(bwrap: str) -> tuple[int, ...]:
    out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    digits = out.stdout.strip().split()[-1] if out.stdout.strip() else "0"
    return tuple(int(p) for p in digits.split(".") if p.isdigit())


def _collapse(dirs: set[str]) -> tuple[str, ...]:
    """Drop directories already covered by a bound parent directory."""
    kept: list[str] = []
    for path in sorted(dirs, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return tuple(sorted(kept))


@functools.cache
def discover_interpreter(python: str = DEFAULT_PYTHON) -> Interpreter:
    """Ask `python` where its stdlib and shared objects live (cached per path)."""
    try:
        out = subprocess.run(
            [python, "-I", "-c", _DISCOVER], capture_output=True, text=True, timeout=30
        )
    except OSError as exc:
        raise SandboxSetupError(f"cannot run sandbox interpreter {python}: {exc}") from exc
    if out.returncode != 0:
        raise SandboxSetupError(f"sandbox interpreter {python} failed: {out.stderr[-500:]}")
    info = json.loads(out.stdout)
    dirs = {os.path.realpath(info["stdlib"]), os.path.realpath(info["platstdlib"])}
    for mapped in info["maps"]:
        if os.path.realpath(mapped) != info["executable"]:
            dirs.add(os.path.dirname(mapped))
            dirs.add(os.path.dirname(os.path.realpath(mapped)))
    symlinks = []
    for top in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):
        if os.path.islink(top):
            symlinks.append((os.readlink(top), top))
    # The ELF loader is named by its /lib64 path in the binary, not by its real path.
    if os.path.isdir("/lib64"):
        dirs.add(os.path.realpath("/lib64"))
    # Paths reached through a top-level symlink are bound at their resolved location.
    dirs = {os.path.realpath(d) for d in dirs if os.path.isdir(d)}
    return Interpreter(
        executable=info["executable"],
        version=info["version"],
        ro_dirs=_collapse(dirs),
        symlinks=tuple(symlinks),
    )


def build_argv(
    *,
    bwrap: str,
    interp: Interpreter,
    limits: Limits,
    ro_data: Sequence[tuple[int, str]],
    work_data: Sequence[tuple[int, str]],
    seccomp_fds: Sequence[int],
    info_fd: int,
    block_fd: int | None,
    disable_userns: bool,
    command: Sequence[str],
) -> list[str]:
    """The bwrap argv. `ro_data`/`work_data` are (fd, sandbox path) pairs to copy in."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup"]
    if disable_userns:
        argv.append("--disable-userns")
    argv += ["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    argv += ["--as-pid-1", "--hostname", "sandbox"]
    for directory in interp.ro_dirs:
        argv += ["--ro-bind", directory, directory]
    argv += ["--ro-bind", interp.executable, interp.executable]
    for target, link in interp.symlinks:
        argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    argv += ["--size", str(SCRATCH_TMP_MB << 20), "--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--size", str(limits.disk_mb << 20), "--tmpfs", "/work"]
    for fd, dest in ro_data:
        argv += ["--ro-bind-data", str(fd), dest]
    for fd, dest in work_data:
        argv += ["--file", str(fd), dest]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/work"]
    for fd in seccomp_fds:
        argv += ["--add-seccomp-fd", str(fd)]
    argv += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/work",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "MALLOC_ARENA_MAX": "2",
        "PYTHONIOENCODING": "utf-8",
    }
    for key, value in env.items():
        argv += ["--setenv", key, value]
    # -I: no environment, user site or script dir on sys.path; -S: no site (nothing to
    # find in the sandbox; the launcher restores exit/quit/help).
    return [*argv, interp.executable, "-I", "-S", *command]
