"""An ASGI app served by uvicorn in a thread of this process: the port bound first (a
port in use is one line, before anything is built), a bounded wait until it listens, and
the foreground wait that Ctrl-C and SIGTERM end. `rldojo serve` (`rldojo.inference.server`)
and `rldojo env serve` (`rldojo.interop`) serve this way; it imports nothing of rldojo,
so an environment server does not load the model-serving stack."""

from __future__ import annotations

import errno
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar

import uvicorn

__all__ = ["PortInUseError", "bind_port", "run_until_stopped", "start_in_thread"]


class PortInUseError(RuntimeError):
    """The port to serve on is taken; a RuntimeError, as every failure to start is. The
    message is the one line the user reads."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(f"port {port} is in use on {host}: pick another with --port")
        self.host, self.port = host, port


def bind_port(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (0: a free port) for uvicorn to listen on, bound the
    way uvicorn binds its own (SO_REUSEADDR, which on Linux still refuses a port another
    socket listens on). Raises `PortInUseError` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(host, port) from None
        raise
    return sock


def start_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    start_timeout_s: float = 60.0,
    name: str = "rldojo-serve",
    sock: socket.socket | None = None,
    lifespan: Literal["auto", "on", "off"] = "off",
) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Serve an ASGI app with uvicorn in a daemon thread; returns once the port is bound
    (port 0 picks a free one): the server, its thread and the bound port. `sock`: a socket
    from `bind_port` (else `host:port` is bound here, `PortInUseError` when taken).
    `lifespan`: uvicorn's (`auto` for an app with startup and shutdown events)."""
    sock = sock or bind_port(host, port)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan=lifespan, access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"{name} did not start on {host}:{port}")
        time.sleep(0.01)
    return server, thread, int(sock.getsockname()[1])


H = TypeVar("H", bound="_Closeable")


class _Closeable(Protocol):
    def close(self) -> None: ...


def run_until_stopped(handle: H, on_ready: Callable[[H], None] | None = None) -> None:
    """Keep a server started in a thread running in the foreground until Ctrl-C or
    SIGTERM (both stop it as cleanly), then close it; `on_ready` gets the handle first."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if on_ready is not None:
            on_ready(handle)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.close()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
