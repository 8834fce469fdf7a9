"""Run the OpenAI-compatible server: in a background thread (tests, in-process judges) or
in the foreground (`rldojo serve`).

    with start_server("tiny-random") as server:        # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=server.url, api_key="unused")
        client.chat.completions.create(model=server.model, messages=[...])

The server binds 127.0.0.1 unless told otherwise: it has no authentication. The port is
bound before anything else starts (a model loads, a thread runs), so a port in use is one
`PortInUseError` at once; `rldojo serve`, `rldojo service` and `rldojo dashboard` bind
through `start_in_thread`.
"""

from __future__ import annotations

import errno
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import uvicorn

from rldojo.inference.app import build_app
from rldojo.inference.engine import ChatEngine, TransformersEngine

__all__ = [
    "PortInUseError",
    "ServerHandle",
    "bind_port",
    "make_engine",
    "run_until_stopped",
    "serve_forever",
    "start_in_thread",
    "start_server",
]


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


def make_engine(model: str | ChatEngine, *, dtype: str = "auto", max_batch: int = 16) -> ChatEngine:
    """An engine for a model name (loaded with transformers), or `model` itself."""
    if isinstance(model, str):
        return TransformersEngine(model, dtype=dtype, max_batch=max_batch)
    return model


@dataclass
class ServerHandle:
    """A running server. `url` is the base URL for the openai SDK (ends in ``/v1``)."""

    host: str
    port: int
    engine: ChatEngine
    _server: uvicorn.Server
    _thread: threading.Thread
    _owns_engine: bool

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model(self) -> str:
        return self.engine.model

    def close(self) -> None:
        """Stop serving and join the thread (and close the engine if we made it)."""
        self._server.should_exit = True
        self._thread.join(timeout=30)
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    start_timeout_s: float = 60.0,
    name: str = "rldojo-serve",
    sock: socket.socket | None = None,
) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Serve an ASGI app with uvicorn in a daemon thread; returns once the port is bound
    (port 0 picks a free one): the server, its thread and the bound port. `sock`: a socket
    from `bind_port` (else `host:port` is bound here, `PortInUseError` when taken)."""
    sock = sock or bind_port(host, port)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
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


def start_server(
    model: str | ChatEngine = "tiny-random",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    dtype: str = "auto",
    max_batch: int = 16,
    start_timeout_s: float = 60.0,
) -> ServerHandle:
    """Serve `model` (a name or an engine) in a daemon thread; port 0 picks a free port.
    The port is bound before the model loads: a port in use costs no load."""
    sock = bind_port(host, port)
    try:
        engine = make_engine(model, dtype=dtype, max_batch=max_batch)
    except BaseException:
        sock.close()
        raise
    try:
        server, thread, bound_port = start_in_thread(
            build_app(engine), host, port, start_timeout_s=start_timeout_s, sock=sock
        )
    except RuntimeError:
        if isinstance(model, str):
            engine.close()
        raise RuntimeError(f"rldojo serve did not start on {host}:{port}") from None
    return ServerHandle(host, bound_port, engine, server, thread, isinstance(model, str))


def serve_forever(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    dtype: str = "auto",
    on_ready: Callable[[ServerHandle], None] | None = None,
) -> None:
    """Serve until interrupted (what `rldojo serve` runs); `on_ready` gets the handle
    once the port is bound (port 0 picks a free one)."""
    run_until_stopped(start_server(model, host, port, dtype=dtype), on_ready)


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
