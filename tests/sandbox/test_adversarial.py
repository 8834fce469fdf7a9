"""Hostile programs are contained: every assertion is on host-side evidence.

Each test bounds its own time (pytest-timeout), checks the run returned soon after its
timeout, and that no process of the pool's sandbox uids survives it. Programs that never
end (the timeout is under test) get a short wall limit; the others end by themselves
and get a generous one, so a slow sandbox start on a loaded machine cannot cut them off.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rldojo.sandbox import ExecResult, SandboxPool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the sandbox: processes
# The wall limit of programs that never end by themselves. It also covers the sandbox's
# start-up (a start past it is a sandbox_error, not a timeout), so it is not cut fine.
RUNAWAY_S = 5.0
GENEROUS_S = 60.0  # of the others (they end in well under a second)


def timed_run(pool: SandboxPool, code: str, **kwargs) -> ExecResult:
    kwargs.setdefault("timeout_s", GENEROUS_S)
    start = time.monotonic()
    result = pool.run(code, **kwargs)
    # Killed at the timeout, not left to run: what runs on would take an hour or forever.
    assert time.monotonic() - start < kwargs["timeout_s"] + 30.0
    return result


@pytest.mark.parametrize(
    "code",
    [
        "while True: pass",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)",
    ],
    ids=["infinite-loop", "sigterm-ignoring-sleep"],
)
def test_runaway_programs_are_killed(pool: SandboxPool, leftovers, code: str) -> None:
    result = timed_run(pool, code, timeout_s=RUNAWAY_S)
    assert result.status == "timeout"
    assert leftovers(pool) == []


def test_fork_bomb_is_bounded(pool: SandboxPool, leftovers) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = timed_run(pool, code, allow_fork=True, timeout_s=RUNAWAY_S)
    assert result.status == "timeout"
    assert leftovers(pool) == []
    # Without opting in, the first fork already fails.
    result = timed_run(pool, "import os\nos.fork()")
    assert "PermissionError" in result.stderr


def test_setsid_daemon_dies_with_the_run(pool: SandboxPool, leftovers) -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(3600)\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    result = timed_run(pool, code, allow_fork=True)
    assert result.stdout == "parent done\n"
    assert leftovers(pool) == []


def test_memory_bomb(pool: SandboxPool, leftovers) -> None:
    result = timed_run(pool, "a = []\nwhile True:\n    a.append(bytearray(10**7))", memory_mb=256)
    assert result.status == "memory"
    assert leftovers(pool) == []


def test_thread_bomb(pool: SandboxPool, leftovers) -> None:
    code = (
        "import threading, time\n"
        "while True:\n"
        "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    before = threading.active_count()
    result = timed_run(pool, code)
    assert "can't start new thread" in result.stderr
    assert threading.active_count() == before
    assert leftovers(pool) == []


def test_stdout_flood_is_capped(pool: SandboxPool) -> None:
    result = timed_run(pool, "while True:\n    print('x' * 10000)")
    assert result.stdout_truncated and len(result.stdout) == 1 << 20


def test_disk_fill_stays_in_tmpfs(pool: SandboxPool) -> None:
    free_before = shutil.disk_usage("/").free
    code = (
        "import itertools\n"
        "for i in itertools.count():\n"
        "    for d in ('/work', '/tmp'):\n"
        "        open(f'{d}/f{i}', 'wb').write(b'x' * 2**20)\n"
    )
    result = timed_run(pool, code)
    assert "No space left" in result.stderr or "File too large" in result.stderr
    # Unbounded, the loop writes gigabytes before the timeout; others may write a little.
    assert free_before - shutil.disk_usage("/").free < 512 << 20
    owned = [p for p in Path("/tmp").iterdir() if p.lstat().st_uid in pool.uids]
    assert owned == []


def test_writes_and_deletes_outside_work_dir(pool: SandboxPool, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    os.chmod(tmp_path, 0o777)
    os.chmod(victim, 0o666)
    targets = [str(victim), "/work/../etc/passwd", "/usr/bin/python3", str(Path.cwd() / "x")]
    code = (
        f"import os, shutil\nfor p in {targets!r}:\n"
        "    for op in (lambda: open(p, 'w').write('pwned'), lambda: os.remove(p),\n"
        "               lambda: shutil.rmtree(os.path.dirname(p))):\n"
        "        try:\n            op()\n            print('did', p)\n"
        "        except OSError:\n            pass\n"
    )
    mtime = victim.stat().st_mtime_ns
    timed_run(pool, code)
    assert victim.read_text() == "original" and victim.stat().st_mtime_ns == mtime
    assert not (Path.cwd() / "x").exists()
    assert Path("/usr/bin/python3").exists()


def test_secrets_are_not_readable(pool: SandboxPool, tmp_path: Path, monkeypatch) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv("RLDOJO_TEST_SECRET", secret)
    hidden = tmp_path / "hidden_tests.json"
    hidden.write_text(secret)
    os.chmod(tmp_path, 0o755)
    os.chmod(hidden, 0o644)
    code = (
        "import os, glob\nprint(dict(os.environ))\n"
        f"paths = ['/etc/shadow', '/proc/1/environ', {str(hidden)!r}]\n"
        "for p in paths + glob.glob('/proc/*/environ'):\n"
        "    try:\n        print(open(p, 'rb').read())\n"
        "    except OSError as e:\n        print(p, e)\n"
    )
    result = timed_run(pool, code)
    assert secret not in result.stdout + result.stderr
    assert "root:" not in result.stdout
    assert "No such file" in result.stdout  # /etc/shadow and the hidden file do not exist


def test_no_network_reaches_the_host(pool: SandboxPool) -> None:
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp.settimeout(0.2)
    abstract = socket.socket(socket.AF_UNIX)
    name = "\0rldojo-test-" + os.urandom(4).hex()
    abstract.bind(name)
    abstract.listen()
    abstract.settimeout(0.2)
    port = tcp.getsockname()[1]
    code = (
        "import socket\n"
        f"for fam, addr in [(socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {name!r})]:\n"
        "    try:\n        s = socket.socket(fam)\n        s.settimeout(0.5)\n"
        "        s.connect(addr)\n        print('CONNECTED')\n"
        "    except OSError as e:\n        print(fam, e)\n"
    )
    result = timed_run(pool, code)
    assert "CONNECTED" not in result.stdout
    for listener in (tcp, abstract):
        with pytest.raises(TimeoutError):
            listener.accept()
        listener.close()


def test_spawning_a_subprocess_fails(pool: SandboxPool, tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    code = (
        "import os, subprocess\n"
        f"cmds = (['/bin/sh', '-c', 'touch {marker}'], ['/usr/bin/python3', '-c', 'print(1)'])\n"
        "for cmd in cmds:\n"
        "    try:\n        subprocess.run(cmd)\n        print('SPAWNED')\n"
        "    except OSError as e:\n        print(e)\n"
        f"os.system('touch {marker}')\n"
    )
    result = timed_run(pool, code)
    assert "SPAWNED" not in result.stdout
    assert not marker.exists()


def test_kill_all_and_kill_parent(pool: SandboxPool, leftovers) -> None:
    victim = subprocess.Popen(["sleep", "3600"])
    uid = pool.uids[0] or os.getuid()
    same_uid = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                                 "sleep", "3600"])  # fmt: skip
    try:
        code = (
            "import os, signal\n"
            f"for pid in (-1, 1, os.getppid(), {victim.pid}, {same_uid.pid}, {os.getpid()}):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError as e:\n        print(pid, e)\n"
            "print('still here')\n"
        )
        result = timed_run(pool, code)
        assert victim.poll() is None and same_uid.poll() is None
        assert result.status in ("ok", "killed")
        assert pool.run("print('pool works')", timeout_s=GENEROUS_S).stdout == "pool works\n"
    finally:
        for proc in (victim, same_uid):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert leftovers(pool) == []


def test_remount_namespaces_and_ptrace_fail(pool: SandboxPool) -> None:
    mounts_before = Path("/proc/self/mountinfo").read_text()
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "calls = {\n"
        "  'mount': lambda: libc.mount(b'none', b'/usr', b'tmpfs', 0, None),\n"
        "  'remount': lambda: libc.mount(None, b'/', None, 0x20 | 0x1, None),\n"
        "  'unshare_user': lambda: libc.unshare(0x10000000),\n"
        "  'unshare_mnt': lambda: libc.unshare(0x00020000),\n"
        "  'setns': lambda: libc.setns(os.open('/proc/self/ns/mnt', os.O_RDONLY), 0),\n"
        "  'ptrace_attach': lambda: libc.ptrace(16, 1, 0, 0),\n"
        "  'ptrace_traceme': lambda: libc.ptrace(0, 0, 0, 0),\n"
        "  'chroot': lambda: libc.chroot(b'/tmp'),\n"
        "}\n"
        "for name, fn in calls.items():\n"
        "    print(name, fn())\n"
    )
    result = timed_run(pool, code)
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert len(lines) == 8 and all(v == "-1" for v in lines.values()), result.stdout
    assert Path("/proc/self/mountinfo").read_text() == mounts_before


def test_proc_sys_is_not_writable(pool: SandboxPool) -> None:
    watched = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname"]
    before = [Path(p).read_text() for p in watched]
    code = (
        "for p in ['/proc/sys/kernel/core_pattern', '/proc/sys/kernel/hostname',\n"
        "          '/proc/sys/vm/drop_caches', '/proc/sysrq-trigger']:\n"
        "    try:\n        open(p, 'w').write('pwned')\n        print('WROTE', p)\n"
        "    except OSError as e:\n        print(p, e)\n"
    )
    result = timed_run(pool, code)
    assert "WROTE" not in result.stdout
    assert [Path(p).read_text() for p in watched] == before
