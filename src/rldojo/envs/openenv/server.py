"""Starting an OpenEnv environment directory's server for `openenv-v1` (its `path` kwarg).

An OpenEnv environment directory (what ``openenv init NAME`` generates) holds
``server/app.py`` with the FastAPI ``app``; its own docs serve it with ``uvicorn
server.app:app``. `shared_server(path)` does that in a subprocess, on loopback at a port
the OS picks (``--port 0``: no race for a free port), with the Python running rldojo (so
the directory's dependencies must be installed there).

Ready is a condition, never a fixed sleep: uvicorn's ``Uvicorn running on URL`` line on
stderr (within `timeout_s`), then ``GET /health`` answering 200 (within the same bound).
A server that exits or misses the bound is stopped and raised as one line naming the
directory and the server's last stderr lines.

One server per directory per process: every episode (and every environment instance)
with the same `path` shares it; a server found dead is started again. All are stopped
at interpreter exit (`atexit`), or by `stop_servers()`. A process killed outright (SIGKILL)
cannot stop them.
"""

from __future__ import annotations

import atexit
import collections
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["LocalServer", "ServerStartError", "shared_server", "stop_servers"]

APP = "server.app:app"
"""The ASGI app of an OpenEnv environment directory (``server/app.py``'s ``app``)."""
_RUNNING = re.compile(r"Uvicorn running on (https?://\S+)")
_TAIL_LINES = 6
"""Stderr lines quoted in a start failure."""


class ServerStartError(RuntimeError):
    """An environment directory's server did not start (message: one line)."""


class LocalServer:
    """One running server process of an environment directory, and its URL."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = path
        self.url = ""
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._ready = threading.Event()
        command = [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", "0"]
        self.process = subprocess.Popen(
            command,
            cwd=path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        drain = threading.Thread(target=self._drain, daemon=True, name=f"openenv-{path.name}")
        drain.start()
        try:
            self._wait(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _drain(self) -> None:
        """Read stderr to its end (so the pipe never fills), keeping the last lines and
        setting `url` from uvicorn's ready line; `_ready` is set at that line or at EOF."""
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._tail.append(line.rstrip())
            found = _RUNNING.search(line)
            if found and not self.url:
                self.url = found.group(1)
                self._ready.set()
        self._ready.set()

    def _wait(self, timeout_s: float) -> None:
        """Block until the server listens and ``/health`` answers 200, or raise."""
        import httpx

        deadline = time.monotonic() + timeout_s
        if not self._ready.wait(timeout_s) or not self.url:
            self._fail(
                f"no 'Uvicorn running' within {timeout_s:g}s"
                if self.alive()
                else f"the server exited (code {self.process.poll()})"
            )
        delay = 0.02
        with httpx.Client(timeout=max(deadline - time.monotonic(), 0.1), trust_env=False) as http:
            while True:
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if not self.alive() or time.monotonic() + delay > deadline:
                    self._fail(f"GET {self.url}/health did not answer 200 within {timeout_s:g}s")
                time.sleep(delay)
                delay = min(2 * delay, 0.5)

    def _fail(self, why: str) -> None:
        self.stop()
        tail = " | ".join(line for line in self._tail if line.strip()) or "(no stderr)"
        raise ServerStartError(
            f"openenv-v1: the OpenEnv server in {self.path} did not start ({why}); "
            f"its last stderr lines: {tail}"
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after `timeout_s`); safe twice."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_SERVERS: dict[Path, LocalServer] = {}
"""The running servers, by resolved directory."""
_LOCK = threading.Lock()
"""Held while a server starts: other episodes of the same process wait and share it."""


def check_env_dir(path: str | Path) -> Path:
    """The resolved directory; `ValueError` (one line) unless it holds ``server/app.py``."""
    resolved = Path(path).expanduser().resolve()
    if not (resolved / "server" / "app.py").is_file():
        raise ValueError(
            f"openenv-v1: {path} is not an OpenEnv environment directory (no server/app.py; "
            "`openenv init NAME` generates one)"
        )
    return resolved


def shared_server(path: str | Path, *, timeout_s: float = 120.0) -> LocalServer:
    """The running server of the environment directory `path`, started on first use
    (blocking: call it in a thread from async code); `ServerStartError` if it fails."""
    resolved = check_env_dir(path)
    with _LOCK:
        server = _SERVERS.get(resolved)
        if server is None or not server.alive():
            _SERVERS.pop(resolved, None)
            server = LocalServer(resolved, timeout_s)
            _SERVERS[resolved] = server
        return server


def stop_servers() -> None:
    """Stop every server this process started (run at interpreter exit)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


atexit.register(stop_servers)
