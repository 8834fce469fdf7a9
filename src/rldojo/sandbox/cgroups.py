"""Optional per-slot pids/memory cgroup, used where the host lets us create one.

A cgroup caps the *whole* sandbox (all processes, threads and tmpfs pages together),
which rlimits cannot: RLIMIT_AS is per process and RLIMIT_NPROC per uid. It is created
beneath the cgroup this process already lives in (so it never escapes limits a host or
container put on us), one per pool slot, and removed when the slot closes.

Both cgroup v1 (separate ``pids`` and ``memory`` hierarchies) and v2 (a delegated
subtree with both controllers enabled) are supported. Processes are attached while
bubblewrap holds the sandbox on ``--block-fd``, before any sandboxed code runs, so
everything it later starts is born inside.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

_ROOT = "/sys/fs/cgroup"


def _own_paths() -> dict[str, str]:
    """Controller name ('' for v2) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(value)


@dataclass
class SlotCgroup:
    """The cgroup directories (one per hierarchy) of one pool slot."""

    pids_dir: str
    memory_dir: str
    version: int
    _limits: tuple[int, int] = (0, 0)

    @property
    def dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.pids_dir, self.memory_dir)))

    def configure(self, pids_max: int, memory_bytes: int) -> None:
        if self._limits == (pids_max, memory_bytes):
            return
        _write(os.path.join(self.pids_dir, "pids.max"), str(pids_max))
        if self.version == 1:
            _write(os.path.join(self.memory_dir, "memory.limit_in_bytes"), str(memory_bytes))
            swap = os.path.join(self.memory_dir, "memory.memsw.limit_in_bytes")
            if os.path.exists(swap):
                with contextlib.suppress(OSError):
                    _write(swap, str(memory_bytes))
        else:
            _write(os.path.join(self.memory_dir, "memory.max"), str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(os.path.join(self.memory_dir, "memory.swap.max"), "0")
        self._limits = (pids_max, memory_bytes)

    def attach(self, pid: int) -> None:
        for directory in self.dirs:
            _write(os.path.join(directory, "cgroup.procs"), str(pid))

    def oom_kills(self) -> int:
        """How many processes the memory controller has OOM-killed in this cgroup."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            with open(os.path.join(self.memory_dir, name), encoding="utf-8") as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def close(self) -> None:
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def _remove_stale(parent: str) -> None:
    """Remove empty slot cgroups left by rldojo processes that died without closing."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            parts = name.split("-")
            ours = len(parts) == 3 and parts[0] == "rldojo" and parts[1].isdigit()
            if ours and not os.path.exists(f"/proc/{parts[1]}"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


def _mkdir(path: str) -> bool:
    _remove_stale(os.path.dirname(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return True


def create_slot_cgroup(tag: str) -> SlotCgroup | None:
    """A fresh pids+memory cgroup under our own, or None where none is writable.

    `tag` must look like ``rldojo-<pid>-<slot>`` (stale ones are found by that name).
    """
    try:
        own = _own_paths()
    except OSError:
        return None
    if "pids" in own and "memory" in own:  # cgroup v1
        pids_dir = os.path.join(_ROOT, "pids", own["pids"].lstrip("/"), tag)
        mem_dir = os.path.join(_ROOT, "memory", own["memory"].lstrip("/"), tag)
        if not (_mkdir(pids_dir) and _mkdir(mem_dir)):
            SlotCgroup(pids_dir, mem_dir, 1).close()
            return None
        if os.path.exists(os.path.join(mem_dir, "memory.limit_in_bytes")):
            return SlotCgroup(pids_dir, mem_dir, 1)
        SlotCgroup(pids_dir, mem_dir, 1).close()
        return None
    if "" in own:  # cgroup v2: needs pids and memory delegated to our subtree
        directory = os.path.join(_ROOT, own[""].lstrip("/"), tag)
        if not _mkdir(directory):
            return None
        if all(os.path.exists(os.path.join(directory, f)) for f in ("pids.max", "memory.max")):
            return SlotCgroup(directory, directory, 2)
        SlotCgroup(directory, directory, 2).close()
    return None
