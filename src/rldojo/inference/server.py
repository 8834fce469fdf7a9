"""Run the OpenAI-compatible server: in a background thread (tests, in-process judges) or
in the foreground (`rldojo serve`).

    with start_server("tiny-random") as server:        # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=server.url, api_key="unused")
        client.chat.completions.create(model=server.model, messages=[...])

The server binds 127.0.0.1 unless told otherwise: without an `api_key` it asks for no
authentication (with one, every /v1 request needs ``Authorization: Bearer <key>``). The
port is
bound before anything else starts (a model loads, a thread runs), so a port in use is
one `PortInUseError` at once; `rldojo serve`, `rldojo service` and `rldojo dashboard` bind
through `start_in_thread`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from rldojo.asgi import (
    PortInUseError,
    bind_port,
    run_until_stopped,
    start_in_thread,
)
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


def make_engine(
    model: str | ChatEngine,
    *,
    dtype: str = "auto",
    max_batch: int = 16,
    max_model_len: int | None = None,
    chat_template: str | None = None,
) -> ChatEngine:
    """An engine for a model name (loaded with transformers), or `model` itself (which
    then has its own context window and chat template)."""
    if isinstance(model, str):
        return TransformersEngine(
            model,
            dtype=dtype,
            max_batch=max_batch,
            max_model_len=max_model_len,
            chat_template=chat_template,
        )
    if max_model_len is not None or chat_template is not None:
        raise ValueError("max_model_len and chat_template are set on the engine passed in")
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
    served_model_name: str | None = None
    """The name clients use for the model (None: the engine's own)."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model(self) -> str:
        """The model name requests must use."""
        return self.served_model_name or self.engine.model

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


def start_server(
    model: str | ChatEngine = "tiny-random",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    dtype: str = "auto",
    max_batch: int = 16,
    start_timeout_s: float = 60.0,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_model_len: int | None = None,
    chat_template: str | None = None,
    request_log: Callable[[str], Any] | None = None,
) -> ServerHandle:
    """Serve `model` (a name or an engine) in a daemon thread; port 0 picks a free port.
    The port is bound before the model loads: a port in use costs no load.
    `served_model_name`: the name clients use (default: the model's); `api_key`: the
    bearer token every /v1 request must carry (None: none asked); `max_model_len`,
    `chat_template`: the context window and chat template of a model loaded by name
    (`TransformersEngine`); `request_log`: gets one line per request (None: none)."""
    sock = bind_port(host, port)
    try:
        engine = make_engine(
            model,
            dtype=dtype,
            max_batch=max_batch,
            max_model_len=max_model_len,
            chat_template=chat_template,
        )
    except BaseException:
        sock.close()
        raise
    try:
        app = build_app(
            engine, served_model_name=served_model_name, api_key=api_key, request_log=request_log
        )
        server, thread, bound_port = start_in_thread(
            app, host, port, start_timeout_s=start_timeout_s, sock=sock
        )
    except RuntimeError:
        if isinstance(model, str):
            engine.close()
        raise RuntimeError(f"rldojo serve did not start on {host}:{port}") from None
    owns = isinstance(model, str)
    return ServerHandle(host, bound_port, engine, server, thread, owns, served_model_name)


def serve_forever(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    dtype: str = "auto",
    on_ready: Callable[[ServerHandle], None] | None = None,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_model_len: int | None = None,
    chat_template: str | None = None,
    request_log: Callable[[str], Any] | None = None,
) -> None:
    """Serve until interrupted (what `rldojo serve` runs); `on_ready` gets the handle
    once the port is bound (port 0 picks a free one). The other options: as for
    `start_server`."""
    handle = start_server(
        model,
        host,
        port,
        dtype=dtype,
        served_model_name=served_model_name,
        api_key=api_key,
        max_model_len=max_model_len,
        chat_template=chat_template,
        request_log=request_log,
    )
    run_until_stopped(handle, on_ready)
