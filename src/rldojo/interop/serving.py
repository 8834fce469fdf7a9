"""An environment server's app in a thread (`rldojo.asgi`: the port bound first, then
uvicorn) and its handle; `rldojo env serve` and the tests start their servers here."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rldojo.asgi import PortInUseError, bind_port, run_until_stopped, start_in_thread

if TYPE_CHECKING:
    import uvicorn

__all__ = ["AppHandle", "PortInUseError", "run_until_stopped", "start_app"]


@dataclass
class AppHandle:
    """A running server; `url` is its base URL (``http://host:port``)."""

    host: str
    port: int
    _server: uvicorn.Server
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        """Stop serving and join the thread."""
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> AppHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_app(
    make_app: Callable[[], Any],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    name: str = "rldojo-app",
    start_timeout_s: float = 60.0,
) -> AppHandle:
    """Bind the port, build the app (`make_app`: a port in use costs no build), serve it
    in a daemon thread, and return once uvicorn listens."""
    sock = bind_port(host, port)
    try:
        app = make_app()
    except BaseException:
        sock.close()
        raise
    server, thread, bound = start_in_thread(
        app, host, port, start_timeout_s=start_timeout_s, name=name, sock=sock, lifespan="auto"
    )
    return AppHandle(host, bound, server, thread)
