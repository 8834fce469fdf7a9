"""Warm interpreters for the tests' child processes: a fork server that has torch,
transformers and rldojo imported, so a child that trains or serves `tiny-random` starts in
milliseconds instead of the ~5 s of CPU (15-20 s on a loaded 2-core machine) a fresh
interpreter spends importing them.

    import warm
    proc = warm.Popen([sys.executable, "-c", code], stdout=..., stderr=..., env=...)
    done = warm.run([sys.executable, "-m", "rldojo.cli", "train", ...], capture_output=True)

`warm.Popen` is a `subprocess.Popen` (pipes, `communicate`, `wait`, `poll`, `send_signal`,
`returncode` as usual) whose child is forked from the server instead of exec'd: `pid` is
the child's, so `send_signal(SIGKILL)` kills the run itself; a signal that kills it shows
as a negative `returncode`, as for any child. The child runs the Python command line it
was given (`-c CODE`, `-m MODULE`, `-` or a script, with `-u`/`-B`) as a fresh `python`
does: its own `sys.argv`, `sys.path` (its `PYTHONPATH`), `__main__`, environment, working
directory and standard streams; `sys.exit`, uncaught exceptions, KeyboardInterrupt,
non-daemon threads and `atexit` end it as they end an interpreter.

`warm.python(env)` gives an executable that does the same for shell scripts
(`PYTHON=... benchmarks/gpu_check.sh`): a stdlib-only stand-in for `python` that asks the
server for the child, forwards the signals it gets (SIGTERM, SIGINT, ...) and exits as the
child did; if the stand-in is SIGKILLed the server kills the child.

What a warm child does not reproduce, and so where these tests keep a fresh interpreter:
import costs and lazy imports (a test that asserts what a command imports), and settings
read at import time. The last are handled by keying servers on them: a child whose
environment differs from the server's in a variable that libraries read when imported
(HF_*, TRANSFORMERS_*, OMP_*, RLDOJO_DEBUG, ...: `_import_time_variables`) gets a server
started with its values. Anything the server cannot run (other interpreter flags, another
executable) runs as a plain subprocess. `RLDOJO_TEST_COLD=1` turns the fork server off.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOAD = ("torch", "transformers", "transformers.models.llama.modeling_llama",
           "transformers.tokenization_python", "transformers.tokenization_utils_tokenizers",
           "safetensors.torch", "rldojo.cli")  # fmt: skip
PRELOAD_PACKAGES = ("rldojo.training", "rldojo.rollout", "rldojo.policy", "rldojo.store")
"""What the server imports: these modules, and every module of these packages but vLLM's
(one that does not import is left out)."""

BENCHMARK_EXPORTS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
"""The import-time variables benchmarks/gpu_check.sh and agentic_gpu.sh export (and the
benchmarks' dry runs are given): a server for a script's `$PYTHON` has them."""

_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_",
             "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA_", "XDG_", "LC_")  # fmt: skip
_RUNTIME = ("TORCHELASTIC_", "TORCH_NCCL_")  # what torchrun gives each rank, read at run time
_NAMES = {"HOME", "LANG", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "TZ", "RLDOJO_DEBUG",
          "COLUMNS", "LINES", "TTY_INTERACTIVE", "TTY_COMPATIBLE", "PYTHONHASHSEED",
          "PYTHONWARNINGS", "PYTHONOPTIMIZE", "PYTHONIOENCODING", "PYTHONUTF8",
          "PYTHONDONTWRITEBYTECODE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE"}  # fmt: skip


_UNSET_AT_IMPORT = {"COLUMNS", "LINES"}
"""Read when imported only if set (rich's consoles fix their width then; unset, they read
it when they print): a server without them serves children with any value."""


def _import_time_variables(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` that libraries may read once, when imported: a server serves
    only children that agree with it on these."""
    return {k: v for k, v in env.items()
            if (k in _NAMES or k.startswith(_PREFIXES)) and not k.startswith(_RUNTIME)}  # fmt: skip


def _agree(server: dict[str, str], child: dict[str, str]) -> bool:
    """Whether a server started with `server`'s environment may fork a child that has
    `child`'s."""
    mine, theirs = _import_time_variables(server), _import_time_variables(child)
    for name in _UNSET_AT_IMPORT - mine.keys():
        theirs.pop(name, None)
    return mine == theirs


# ---------------------------------------------------------------------- the wire

_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    data = b""
    while len(data) < n:
        if fds is not None and not data:
            chunk, got, _, _ = socket.recv_fds(sock, n - len(data), 8)
            fds.extend(got)
        else:
            chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _recv(sock: socket.socket, fds: list[int] | None = None) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, fds))
    return json.loads(_recv_exact(sock, size))


# ---------------------------------------------------------------------- the command line


def _parse(argv: list[str]) -> dict[str, Any] | None:
    """A `python` command line (without the executable) as what to run; None for what a
    warm child does not do."""
    options = {"unbuffered": False, "no_bytecode": False}
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-", "-c", "-m"):
        flag = argv[i]
        if flag == "-u":
            options["unbuffered"] = True
        elif flag == "-B":
            options["no_bytecode"] = True
        else:
            return None
        i += 1
    rest = argv[i:]
    if not rest:
        return None  # an interactive interpreter
    if rest[0] in ("-c", "-m"):
        if len(rest) < 2:
            return None
        return {**options, "kind": rest[0][1], "what": rest[1], "args": rest[2:]}
    if rest[0] == "-":
        return {**options, "kind": "stdin", "what": "-", "args": rest[1:]}
    return {**options, "kind": "script", "what": rest[0], "args": rest[1:]}


# ---------------------------------------------------------------------- the server


class _Server:
    """Runs in the server process: imports, then forks a child per request."""

    def __init__(self, path: str, env: dict[str, str]) -> None:
        self.env = env  # before the imports
        # what the imports set (torch: TORCHINDUCTOR_CACHE_DIR), as they would in the child
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in env}
        own = [p for p in self.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        # sys.path less the server's own first entry and PYTHONPATH: a child puts its own
        self.base_path = [p for p in sys.path[1:] if p not in {os.path.abspath(x) for x in own}
                          and p not in own]  # fmt: skip
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.children: dict[int, socket.socket | None] = {}  # pid: its client's connection
        self.clients: dict[int, tuple[socket.socket, int]] = {}  # fileno: (conn, pid)

    def serve(self) -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while True:
            watched = [self.listener, self.wake_r, 0, *(c for c, _ in self.clients.values())]
            readable, _, _ = select.select(watched, [], [], 1.0)
            for item in readable:
                if item is self.listener:
                    self._accept()
                elif item == self.wake_r:
                    os.read(self.wake_r, 4096)
                elif item == 0:
                    if not os.read(0, 4096):  # the tests' process is gone
                        self._stop()
                        return
                else:
                    self._client_gone(item)
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            request = _recv(conn, fds)
        except (EOFError, OSError, ValueError):
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        refusal = self._refusal(request, fds)
        if refusal:
            try:
                _send(conn, {"refused": refusal})
            except OSError:
                pass
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:  # the child: ends by raising what ends the interpreter
            self._become_child(request, fds, conn)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.clients[conn.fileno()] = (conn, pid)
        try:
            _send(conn, {"pid": pid})
        except OSError:  # the client is gone: so goes its child, at the next select
            pass

    def _refusal(self, request: dict[str, Any], fds: list[int]) -> str | None:
        if len(fds) != 3:
            return "three standard streams expected"
        if _parse(request["argv"]) is None:
            return f"not a command line a warm child runs: {request['argv']}"
        if not _agree(self.env, request["env"]):
            mine, theirs = _import_time_variables(self.env), _import_time_variables(request["env"])
            differ = sorted(set(mine.items()) ^ set(theirs.items()))
            return f"import-time variables differ: {differ}"
        return None

    def _client_gone(self, conn: socket.socket) -> None:
        """A client's connection ended (or spoke) before its child did: when it ended,
        the child goes too (its stand-in was SIGKILLed, or the test process died)."""
        _, pid = self.clients.pop(conn.fileno())
        try:
            alive = conn.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            alive = False
        if alive:  # a client never writes after its request; ignore, keep it
            self.clients[conn.fileno()] = (conn, pid)
            return
        conn.close()
        if pid in self.children:
            self.children[pid] = None
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.clients.pop(conn.fileno(), None)
                try:
                    _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                except OSError:
                    pass
                conn.close()

    def _stop(self) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ the child

    def _become_child(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
        """In the forked child: become the requested `python` process, run, exit."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for sock in (self.listener, conn, *(c for c, _ in self.clients.values())):
            sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        if request.get("new_session"):
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**self.set_by_imports, **request["env"]})
        _run_as_python(_parse(request["argv"]), request["env"], self.base_path)


def _streams(unbuffered: bool) -> None:
    """New standard streams over the child's descriptors 0-2, buffered as python buffers
    them (`-u`, PYTHONUNBUFFERED, PYTHONIOENCODING). The server's own never close their
    descriptors (python opens them with closefd=False)."""
    import io

    encoding = os.environ.get("PYTHONIOENCODING", "").split(":")[0] or "utf-8"
    unbuffered = unbuffered or bool(os.environ.get("PYTHONUNBUFFERED"))
    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                             encoding=encoding)  # fmt: skip
    outs = []
    for fd in (1, 2):
        raw = io.FileIO(fd, "w", closefd=False)
        buffered = raw if unbuffered else io.BufferedWriter(raw)
        outs.append(io.TextIOWrapper(buffered, encoding=encoding,
                                     errors="backslashreplace" if fd == 2 else "strict",
                                     line_buffering=fd == 2 or os.isatty(fd),
                                     write_through=unbuffered))  # fmt: skip
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = outs[0]
    sys.stderr = sys.__stderr__ = outs[1]


def _trimmed(hook: Any, skip: tuple[str, ...]) -> Any:
    """`hook` (sys.excepthook) without the traceback's leading frames from `skip` (this
    file, runpy): a traceback starts where the command's code does, as python's."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in skip:
            tb = tb.tb_next
        hook(kind, value.with_traceback(tb), tb)  # python prints the exception's own

    return excepthook


def _run_as_python(command: dict[str, Any] | None, env: dict[str, str], base: list[str]) -> None:
    """Run `command` as `python` would, then end this process the way python ends: the
    SystemExit (or uncaught exception, KeyboardInterrupt included) goes up to the top of
    the server's code, and the interpreter exits on it (non-daemon threads, atexit,
    flushed streams, exit status)."""
    import builtins
    import random
    import runpy
    import types

    assert command is not None
    _streams(command["unbuffered"])
    sys.dont_write_bytecode = command["no_bytecode"] or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    tempfile.tempdir = None  # TMPDIR is the child's
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    kind, what = command["kind"], command["what"]
    first = {"c": "", "stdin": "", "m": os.getcwd()}.get(kind)
    if first is None:
        first = os.path.dirname(os.path.realpath(what))
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *[os.path.abspath(p) for p in pythonpath], *base]
    sys.argv = [{"c": "-c", "m": "-m", "stdin": "-"}.get(kind, what), *command["args"]]
    skip = (__file__, "<frozen runpy>") if kind == "script" else (__file__,)
    sys.excepthook = _trimmed(sys.excepthook, skip)
    try:
        if kind == "m":  # as `python -m` does; a module the server imported runs anew
            sys.modules.pop(what, None)  # as __main__ (else runpy warns of the copy)
            runpy._run_module_as_main(what, alter_argv=True)
        elif kind == "script":
            runpy.run_path(what, run_name="__main__")
        else:
            source = sys.stdin.read() if kind == "stdin" else what
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins
            sys.modules["__main__"] = main
            exec(compile(source, "<stdin>" if kind == "stdin" else "<string>", "exec"),
                 main.__dict__)  # fmt: skip
    except KeyboardInterrupt:
        _UNHANDLED_SIGINT.append(True)
        raise
    raise SystemExit(0)


_UNHANDLED_SIGINT: list[bool] = []


def _exit_by_sigint() -> None:
    """The last exit function (registered before the imports): after a KeyboardInterrupt
    nothing caught, die of SIGINT, as python does."""
    if _UNHANDLED_SIGINT:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _serve_main(path: str) -> None:
    import importlib
    import pkgutil

    atexit.register(_exit_by_sigint)  # first: runs last
    env = dict(os.environ)
    names = list(PRELOAD)
    for package in PRELOAD_PACKAGES:
        try:
            found = pkgutil.iter_modules(importlib.import_module(package).__path__, package + ".")
            names += [m.name for m in found if "vllm" not in m.name]
        except Exception:
            pass
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a module that does not import is left out
            pass
    # A fork copies only the forking thread: no Python thread may run here. (numpy's
    # OpenBLAS starts native workers when imported; it re-creates them after a fork.)
    if threading.active_count() != 1:
        sys.stdout.write(f"refused: {threading.active_count()} threads after the imports\n")
        sys.stdout.flush()
        return
    _Server(path, env).serve()


# ---------------------------------------------------------------------- the tests' side

_lock = threading.Lock()
_servers: list[_Handle] = []


class _Handle:
    """A server started by this process, for one set of import-time variables."""

    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="rldojo-warm-")
        self.path = os.path.join(self.dir, "socket")
        ours = _import_time_variables(dict(os.environ))
        server_env = {k: v for k, v in os.environ.items() if k not in ours}
        server_env.update(_import_time_variables(env))
        for name in _UNSET_AT_IMPORT:  # see _UNSET_AT_IMPORT: the server serves any value
            server_env.pop(name, None)
        self.env = server_env
        # The server's stdin is a pipe this process holds: when this process ends, so does it.
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", self.path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env, text=True,
            cwd=self.dir,
        )  # fmt: skip
        assert self.proc.stdout is not None
        # the imports: seconds, a minute on a loaded machine; never a hang of the tests
        if select.select([self.proc.stdout], [], [], 300)[0]:
            line = self.proc.stdout.readline().strip()
        else:
            self.proc.kill()
            line = "no answer in 300 s"
        self.ready = line == "ready"
        self.why = line or f"exited {self.proc.wait()}"

    def connect(self) -> socket.socket | None:
        if not self.ready or self.proc.poll() is not None:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        return sock


def _stop_servers() -> None:
    """At this process's exit: each server ends (its stdin closes) and is waited for, so
    that its CPU time counts to this process's children."""
    for handle in _servers:
        if handle.proc.stdin is not None:
            handle.proc.stdin.close()
        try:
            handle.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            handle.proc.kill()
            handle.proc.wait()


if __name__ != "__main__":  # in the tests' process (the server runs this file as __main__)
    atexit.register(_stop_servers)


def enabled() -> bool:
    return os.environ.get("RLDOJO_TEST_COLD", "") != "1" and hasattr(os, "fork")


def _server_for(env: dict[str, str]) -> _Handle:
    with _lock:
        for handle in _servers:  # one that never started is not tried again
            alive = handle.proc.poll() is None or not handle.ready
            if alive and _agree(handle.env, env):
                return handle
        handle = _Handle(env)
        _servers.append(handle)
        return handle


def _request(argv: list[str], env: dict[str, str], cwd: str, fds: list[int],
             new_session: bool) -> tuple[socket.socket, int] | None:  # fmt: skip
    """Ask a server for the child: (the connection its exit status comes on, its pid), or
    None when no server runs it."""
    if not enabled() or _parse(argv) is None:
        return None
    sock = _server_for(env).connect()
    if sock is None:
        return None
    try:
        _send(sock, {"argv": argv, "env": env, "cwd": cwd, "new_session": new_session}, fds)
        reply = _recv(sock)
    except (OSError, EOFError):
        sock.close()
        return None
    if "pid" not in reply:
        sock.close()
        return None
    return sock, reply["pid"]


class Popen(subprocess.Popen):
    """`subprocess.Popen` for `[sys.executable, *python args]`, the child forked from a
    warm server (see the module's docstring); any other command runs as usual."""

    _warm: socket.socket | None = None

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):  # fmt: skip
        argv = [os.fspath(a) for a in ([args] if isinstance(args, (str, bytes)) else args)]
        plain = (shell or executable is not None or preexec_fn is not None or pass_fds
                 or not close_fds or gid is not None or gids is not None or uid is not None
                 or umask >= 0 or process_group not in (None, -1) or not argv
                 or argv[0] != sys.executable)  # fmt: skip
        got = None
        if not plain:
            streams = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                       errwrite if errwrite != -1 else 2]  # fmt: skip
            child_env = dict(os.environ if env is None else env)
            where = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
            got = _request(argv[1:], child_env, where, streams, start_new_session)
        if got is None:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds,
                                          cwd, env, startupinfo, creationflags, shell,
                                          p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, restore_signals, gid, gids, uid, umask,
                                          start_new_session, process_group)  # fmt: skip
        self._warm, self.pid = got
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _returncode_from(self, timeout: float | None) -> int | None:
        assert self._warm is not None
        self._warm.settimeout(timeout)
        try:
            reply = _recv(self._warm)
        except (TimeoutError, BlockingIOError):
            return None
        except (OSError, EOFError):
            reply = {"returncode": -signal.SIGKILL}  # the server is gone, and its children
        finally:
            if self._warm is not None:
                self._warm.settimeout(None)
        self._warm.close()
        return int(reply["returncode"])

    def _internal_poll(self, _deadstate=None, **_unused):  # type: ignore[override]
        if self._warm is None:
            return super()._internal_poll(_deadstate)
        if self.returncode is None and not self._warm._closed:  # type: ignore[attr-defined]
            if not self._waitpid_lock.acquire(False):
                return None  # another thread waits for it
            try:
                if self.returncode is None:
                    self.returncode = self._returncode_from(0.0)
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def _wait(self, timeout):  # type: ignore[override]
        if self._warm is None:
            return super()._wait(timeout)
        with self._waitpid_lock:
            if self.returncode is None:
                self.returncode = self._returncode_from(timeout)
                if self.returncode is None:
                    raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def run(*popenargs: Any, input: Any = None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:  # fmt: skip
    """`subprocess.run` with `warm.Popen`."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
        retcode = process.poll()
        if check and retcode:
            raise subprocess.CalledProcessError(retcode, process.args, stdout, stderr)
    return subprocess.CompletedProcess(process.args, retcode, stdout, stderr)


# ---------------------------------------------------------------------- shell scripts' stand-in

_STAND_IN = """#!{python} -S
import sys
sys.path.insert(0, {tests!r})
import warm
warm._stand_in_main({socket!r})
"""


def python(env: dict[str, str] | None = None) -> str:
    """An executable for `$PYTHON` in shell scripts: runs its command line in a warm child
    of a server for `env`'s import-time variables (started now), else execs the real
    interpreter."""
    env = dict(os.environ if env is None else env)
    if not enabled():
        return sys.executable
    handle = _server_for(env)
    path = os.path.join(handle.dir, "python")
    if not os.path.exists(path):
        text = _STAND_IN.format(python=sys.executable, tests=str(Path(__file__).parent),
                                socket=handle.path)  # fmt: skip
        Path(path).write_text(text)
        os.chmod(path, 0o755)
    return path


def _forward(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _stand_in_main(path: str) -> None:
    """The stand-in: ask the server at `path` for the child, forward signals, exit as it did."""
    argv = sys.argv[1:]
    sock = None
    if enabled() and _parse(argv) is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            _send(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                         "new_session": False}, [0, 1, 2])  # fmt: skip
            reply = _recv(sock)
        except (OSError, EOFError):
            reply = {}
        if "pid" not in reply:
            sock.close()
            sock = None
    if sock is None:
        os.execv(sys.executable, [sys.executable, *argv])
    pid = reply["pid"]
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2):  # fmt: skip
        signal.signal(number, lambda n, _f: _forward(pid, n))
    code = _wait_for(pid, sock)
    if code < 0:  # die of the same signal
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _wait_for(pid: int, sock: socket.socket) -> int:
    """The child's exit status: read from /proc the moment it ends (while it is a zombie
    the server has not reaped), else the server's word. Its end shows on this process at
    once, as a child's would, however busy the server (torchrun names the rank that died
    first by which of its processes it sees end first)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = None
    while True:
        try:
            ready, _, _ = select.select([sock] + ([pidfd] if pidfd is not None else []), [], [])
            if pidfd in ready:
                code = _zombie_status(pid)
                if code is not None:
                    return code
                pidfd = None  # reaped already: the server says
                continue
            return int(_recv(sock)["returncode"])
        except InterruptedError:
            continue
        except (OSError, EOFError, ValueError, KeyError):
            return -signal.SIGKILL


def _zombie_status(pid: int) -> int | None:
    """The exit status of an ended, not yet reaped process (field 52 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) < 50 or fields[0] != "Z":
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    _serve_main(sys.argv[2])
