"""Worker slots: one host uid (and optionally one cgroup) per concurrently running sandbox.

A uid per slot keeps RLIMIT_NPROC and process accounting per sandbox, and lets a slot's
leftovers be found by uid. Uids are claimed with ``flock`` on a root-only lock directory,
so two rldojo processes on one machine (pytest workers, Ray workers) never share one.
When this process is not root it cannot change uid: slots then carry ``uid=None`` and
sandboxes run as the caller's own unprivileged uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

from rldojo.sandbox.cgroups import create_slot_cgroup
from rldojo.sandbox.runner import Slot

BASE_UID = 60000
MAX_SLOTS = 4096
_LOCK_DIR = os.path.join(tempfile.gettempdir(), "rldojo-sandbox-uids")


def _lock_dir() -> str:
    os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
    return _LOCK_DIR


def claim_slot(index: int, *, base_uid: int = BASE_UID, cgroup: bool = True) -> Slot:
    """Claim a free uid at or after ``base_uid + index`` (root), plus a cgroup if wanted.
    A uid is free when no live claimant holds its lock and no process runs as it (one a
    killed claimant left behind)."""
    tag = f"rldojo-{os.getpid()}-s{index}"  # index is unique within this process
    if os.geteuid() != 0:
        return Slot(index=index, uid=None, cgroup=create_slot_cgroup(tag) if cgroup else None)
    directory = _lock_dir()
    for offset in range(MAX_SLOTS):
        uid = base_uid + (index + offset) % MAX_SLOTS
        path = os.path.join(directory, str(uid))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if processes_of_uid(uid):  # a dead claimant's stranded sandbox still runs as it:
            os.close(fd)  # sharing its uid would let the two signal each other
            continue
        group = create_slot_cgroup(tag) if cgroup else None
        return Slot(index=index, uid=uid, cgroup=group, lock_fd=fd)
    raise RuntimeError(f"no free sandbox uid in {base_uid}..{base_uid + MAX_SLOTS - 1}")


def release_slot(slot: Slot) -> None:
    if slot.cgroup is not None:
        slot.cgroup.close()
        slot.cgroup = None
    if slot.lock_fd is not None:
        with contextlib.suppress(OSError):
            os.close(slot.lock_fd)
        slot.lock_fd = None


def processes_of_uid(uid: int) -> list[int]:
    """Host pids whose real uid is `uid` (evidence for tests; cleanup of a slot)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(name))
                        break
        except (OSError, ValueError):
            continue
    return pids
