"""Serving the dashboard: in a thread (tests, benchmarks) or in the foreground."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from rldojo.asgi import start_in_thread
from rldojo.dashboard.app import create_app


@dataclass
class DashboardHandle:
    """A dashboard serving in a thread; `url` is its base URL (ends in `/`)."""

    host: str
    port: int
    _server: uvicorn.Server
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> DashboardHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_dashboard(
    roots: list[Path] | list[str], host: str = "127.0.0.1", port: int = 0
) -> DashboardHandle:
    """Serve the dashboard over `roots` in a daemon thread (port 0: a free port)."""
    server, thread, bound = start_in_thread(create_app(roots), host, port, name="rldojo-dashboard")
    return DashboardHandle(host, bound, server, thread)
