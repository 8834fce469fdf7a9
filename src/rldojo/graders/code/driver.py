"""Trusted grading driver: runs inside the sandbox, next to the candidate, never with it.

Shipped into the sandbox as ``/rldojo/entry.py`` and run as its pid 1 by
``/usr/bin/python3 -I`` (stdlib only, no rldojo imports). It receives test *inputs* only;
expected outputs never enter the sandbox. For each test it forks a fresh child that
closes every descriptor except its own result memfd, wipes the nonce, lowers rlimits,
installs the candidate seccomp filter and only then compiles and runs the candidate. The
driver waits on a pidfd with the per-test timeout, kills everything else in the pid
namespace (``kill(-1)`` from pid 1), and forwards the child's raw result to the parent
in one nonce-framed record per test on the control channel.

Threat model (the candidate can run arbitrary Python, walk the stack and gc, use ctypes):

- Defended: forging records. The candidate runs in a process that never holds the
  control channel (closed before its code runs); this driver is non-dumpable, so its
  ``/proc/1/fd`` and ``/proc/1/mem`` are closed to the same uid; ptrace and
  process_vm_* are denied by seccomp; as pid 1 it ignores signals from inside. The
  per-run nonce (read into a bytearray, never copied, zeroed in each child before
  candidate code) authenticates frames should a channel descriptor ever leak.
- Defended: claiming a pass. A child only reports a *value*; the parent compares it with
  expected outputs the sandbox never saw, type-strictly. Whatever the candidate forges
  in its own result file is at best a wrong value, and extra or malformed data is
  reported as tampering. Early exit, atexit handlers, patched builtins and
  ``__eq__``-overriding objects are recorded for flags.
- Defended: reading tests. Nothing on disk holds expected outputs. Decoy test files in
  /work are watched: their access time changes on a read (O_NOATIME and utime* are
  denied by the candidate filter), which flags ``hack:test_read``.
- Not defended: the candidate can read every test *input* (it must receive them) and can
  hard-code answers for inputs it has seen in the prompt; held-out tests catch that
  (``hack:visible_only``). It can also make one of its own tests fail in any way it likes.
"""

import atexit
import builtins
import json
import os
import select
import sys
import time
import traceback

sys.path.insert(0, "/rldojo")
import code_values
import launcher

SOLUTION = "/rldojo/solution.py"
RESULT_FD = 3


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _memfd(name, data=b""):
    fd = os.memfd_create(name, 0)
    if data:
        os.pwrite(fd, data, 0)
    return fd


def _read(fd, cap):
    data = os.pread(fd, cap + 1, 0)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _sweep():
    """Kill every other process of the namespace (we are its pid 1) and reap them all,
    so that no leftover of one test counts against the next one's process limit."""
    try:
        os.kill(-1, 9)
    except OSError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _fork():
    for attempt in range(5):
        try:
            return os.fork()
        except BlockingIOError:  # EAGAIN: process limit, e.g. dying leftovers
            time.sleep(0.02 * (attempt + 1))
    return os.fork()


def _safe(fn, default):
    try:
        return fn()
    except BaseException:
        return default


def _changed_builtins(snapshot):
    now = vars(builtins)
    names = [k for k, v in snapshot.items() if now.get(k, snapshot) is not v]
    names += [k for k in now if k not in snapshot]
    return sorted(names)[:20]


def _restore_builtins(snapshot):
    now = vars(builtins)
    now.clear()
    now.update(snapshot)


def _exit_code(exc):
    try:
        code = exc.code
    except BaseException:
        return 1
    if code is None:
        return 0
    return code if type(code) is int else 1


def _type_name(exc):
    try:
        return type(exc).__name__
    except BaseException:
        return "?"


def _call(job, test):
    """Run the candidate module and call its entry point on this test's inputs."""
    snapshot = dict(vars(builtins))
    args = code_values.decode(test["args"])
    kwargs = code_values.decode(test["kwargs"]) if test.get("kwargs") else {}
    with open(SOLUTION, "rb") as fh:
        source = fh.read()
    ns: dict = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(source, "solution.py", "exec"), ns)
        value = ns[job["entry_point"]](*args, **kwargs)
        record = {"value": code_values.encode(value)}
    except SystemExit as exc:
        record = {"exit": _exit_code(exc)}
    except BaseException as exc:
        record = {"exception": _type_name(exc)}
    record["atexit"] = _safe(atexit._ncallbacks, 0)
    record["builtins"] = _safe(lambda: _changed_builtins(snapshot), [])
    _safe(lambda: _restore_builtins(snapshot), None)  # so that reporting still works
    return record


def _program():
    """Run the candidate as a stdin/stdout program (``__main__``)."""
    with open(SOLUTION, "rb") as fh:
        source = fh.read()
    sys.argv = ["solution.py"]
    ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(source, "solution.py", "exec"), ns)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        _safe(traceback.print_exc, None)
        code = 1
    return {"exit": code, "atexit": _safe(atexit._ncallbacks, 0)}


def _child(job, test, nonce, prepared, fds, setup_w):
    """In the forked test process: shed everything trusted, then run candidate code.

    The setup byte goes down a pipe whose write end is closed before candidate code
    runs, so a candidate cannot fake a setup failure (which would make the grade an
    error instead of a failure).
    """
    try:
        nonce[:] = bytes(len(nonce))
        os.dup2(fds["result"], RESULT_FD)
        if "stdin" in fds:
            os.dup2(fds["stdin"], 0)
            os.dup2(fds["stdout"], 1)
        launcher.apply_limits(job["child_limits"])
        launcher.ignore_sigxfsz()
        launcher.install_filter(prepared)
        os.write(setup_w, b"1")
        os.closerange(RESULT_FD + 1, 1 << 16)
    except BaseException:
        os._exit(121)
    me = os.getpid()
    record = _call(job, test) if job["mode"] == "call" else _program()
    if os.getpid() != me:  # a process the candidate forked returned here: it reports nothing
        os._exit(0)
    for stream in (sys.stdout, sys.stderr):
        _safe(stream.flush, None)
    data = _safe(lambda: json.dumps(record).encode(), b"")
    _safe(lambda: os.write(RESULT_FD, data), None)
    os._exit(0)


def run_test(job, test, nonce, prepared, timeout):
    """Fork one test process, wait for it (pidfd), collect its raw result."""
    fds = {"result": _memfd("result")}
    if job["mode"] == "io":
        fds["stdin"] = _memfd("stdin", test["stdin"].encode())
        fds["stdout"] = _memfd("stdout")
    setup_r, setup_w = os.pipe()
    start = time.monotonic()
    try:
        pid = _fork()
    except OSError as exc:
        return {"driver_error": f"fork failed: {exc}"}
    if pid == 0:
        _child(job, test, nonce, prepared, fds, setup_w)
    os.close(setup_w)
    pidfd = os.pidfd_open(pid)
    timed_out = not select.select([pidfd], [], [], timeout)[0]
    if timed_out:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    _sweep()
    cap = job["payload_cap"]
    record = {"secs": round(time.monotonic() - start, 4), "timeout": timed_out}
    record["status"] = os.waitstatus_to_exitcode(status)
    record["setup_ok"] = os.read(setup_r, 1) == b"1"
    os.close(setup_r)
    record["payload"], record["payload_truncated"] = _read(fds["result"], cap)
    if "stdout" in fds:
        record["stdout"], record["stdout_truncated"] = _read(fds["stdout"], cap)
    for fd in fds.values():
        os.close(fd)
    return record


def main():
    job = launcher.load_job()
    nonce = launcher.read_nonce(job["nonce_fd"])
    ctl = job["control_fd"]
    launcher.set_dumpable(False)
    launcher.emit_raw(ctl, nonce, launcher.START_RECORD)
    launcher.apply_limits(job["driver_limits"])
    launcher.install_site_builtins()
    prepared = launcher.load_filter()
    decoys = {path: _stat(path) for path in job["decoys"]}
    deadline = time.monotonic() + job["total_s"]
    for index, test in enumerate(job["tests"]):
        remaining = deadline - time.monotonic()
        record: dict
        if remaining <= 0:
            record = {"skipped": "time budget exhausted"}
        else:
            record = run_test(job, test, nonce, prepared, min(job["test_timeout_s"], remaining))
        record["decoys_touched"] = any(_stat(p) != s for p, s in decoys.items())
        launcher.emit(ctl, nonce, dict(record, k="test", i=index))
    launcher.emit(ctl, nonce, {"k": "done"})


if __name__ == "__main__":
    main()
