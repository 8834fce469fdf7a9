"""Seccomp filters of the sandbox, compiled to BPF in the parent with pyseccomp (libseccomp).

Two filters stack; a process keeps every filter it was given and the strictest verdict wins:

- The **base** filter is loaded by bubblewrap (``--seccomp FD``) just before it execs the
  interpreter, so it covers everything in the sandbox, the trusted launcher/driver included:
  debugging and cross-process memory access (ptrace, process_vm_*), mounts, namespaces
  (unshare, setns, namespace flags on clone), kernel attack surface (bpf, io_uring,
  userfaultfd, perf, keyctl, modules, kexec...), and every socket family except AF_UNIX.
- The **candidate** filter is loaded by bubblewrap too for a plain run, or installed by
  the trusted grading driver with prctl in each process that runs candidate code: no
  process creation (fork, vfork, clone without CLONE_THREAD, execve) unless the task
  opts in, and no ``utime*``/``O_NOATIME`` so that a read of a decoy test file always
  leaves an access time the driver can see.

Both use the libseccomp defaults for foreign architectures (x32/i386 syscalls kill the
process). Denied calls fail with an errno (EPERM, EAFNOSUPPORT; clone3 gets ENOSYS so
glibc falls back to clone, whose flags a filter can inspect).
"""

from __future__ import annotations

import errno
import functools
import os
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyseccomp import SyscallFilter

# Linux constants (x86_64 and aarch64 share these).
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)
_AF_UNIX = 1
_O_NOATIME = 0o1000000
_TIOCSTI = 0x5412

_DENIED_EVERYWHERE = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr",
    "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    "perf_event_open", "keyctl", "add_key", "request_key", "lookup_dcookie",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl", "vhangup",
    "open_by_handle_at", "name_to_handle_at", "move_pages", "migrate_pages",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)  # fmt: skip
_PROCESS_CREATION = ("fork", "vfork", "execve", "execveat")
_TIMESTAMP_FORGERY = ("utime", "utimes", "utimensat", "futimesat")


def available() -> bool:
    """True when pyseccomp and libseccomp can be loaded."""
    try:
        _sc()
    except Exception:
        return False
    return True


def _sc() -> ModuleType:
    import pyseccomp

    return pyseccomp


def _deny(
    flt: SyscallFilter, sc: ModuleType, names: tuple[str, ...], err: int = errno.EPERM
) -> None:
    for name in names:
        try:
            flt.add_rule(sc.ERRNO(err), name)
        except Exception:  # a syscall this kernel/arch does not have
            continue


def _base_filter() -> SyscallFilter:
    sc = _sc()
    flt = sc.SyscallFilter(sc.ALLOW)
    _deny(flt, sc, _DENIED_EVERYWHERE)
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in _CLONE_NAMESPACE_FLAGS:
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for call in ("socket", "socketpair"):
        flt.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.NE, _AF_UNIX))
    flt.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.EQ, _TIOCSTI))
    return flt


def _candidate_filter(allow_fork: bool, block_exec: bool) -> SyscallFilter:
    sc = _sc()
    flt = sc.SyscallFilter(sc.ALLOW)
    if not allow_fork:
        _deny(flt, sc, _PROCESS_CREATION if block_exec else ("fork", "vfork"))
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    _deny(flt, sc, _TIMESTAMP_FORGERY)
    flt.add_rule(sc.ERRNO(errno.EPERM), "open", sc.Arg(1, sc.MASKED_EQ, _O_NOATIME, _O_NOATIME))
    flt.add_rule(sc.ERRNO(errno.EPERM), "openat", sc.Arg(2, sc.MASKED_EQ, _O_NOATIME, _O_NOATIME))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "openat2")  # its flags live in a struct
    return flt


def _export(flt: SyscallFilter) -> bytes:
    fd = os.memfd_create("rldojo-bpf", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as fh:
            flt.export_bpf(fh)
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


@functools.cache
def base_program() -> bytes:
    """BPF of the base filter (raw ``struct sock_filter`` array, as bwrap expects)."""
    return _export(_base_filter())


@functools.cache
def candidate_program(allow_fork: bool, *, block_exec: bool = True) -> bytes:
    """BPF of the candidate filter.

    The grading driver installs it in-sandbox (``prctl``) in the processes that run
    candidate code; for a plain run bubblewrap loads it together with the base filter,
    which must then let bwrap's own final ``execve`` of the interpreter through
    (``block_exec=False``: without fork an exec only replaces the process, keeping its
    filters and limits).
    """
    return _export(_candidate_filter(allow_fork, block_exec))
