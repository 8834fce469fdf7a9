"""Run the OpenAI-compatible server: in a background thread (tests, in-process judges) or
in the foreground (`rldojo serve`).

    with start_server("tiny-random") as server:        # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=server.url, api_key="unused")
        client.chat.completions.create(model=server.model, messages=[...])

The server binds 127.0.0.1 unless told otherwise: it has no authentication.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import uvicorn

from rldojo.serve.app import build_app
from rldojo.serve.engine import ChatEngine, TransformersEngine

__all__ = [
    "ServerHandle",
    "make_engine",
    "run_until_stopped",
    "serve_forever",
    "start_in_thread",
    "start_server",
]


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
) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Serve an ASGI app with uvicorn in a daemon thread; returns once the port is bound
    (port 0 picks a free one): the server, its thread and the bound port."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"{name} did not start on {host}:{port}")
        time.sleep(0.01)
    sockets: list[Any] = [s for srv in server.servers for s in srv.sockets]
    return server, thread, int(sockets[0].getsockname()[1])


def start_server(
    model: str | ChatEngine = "tiny-random",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    dtype: str = "auto",
    max_batch: int = 16,
    start_timeout_s: float = 60.0,
) -> ServerHandle:
    """Serve `model` (a name or an engine) in a daemon thread; port 0 picks a free port."""
    engine = make_engine(model, dtype=dtype, max_batch=max_batch)
    try:
        server, thread, bound_port = start_in_thread(
            build_app(engine), host, port, start_timeout_s=start_timeout_s
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
