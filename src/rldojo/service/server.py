"""Run the service: in a background thread (tests, benchmarks) or in the foreground.

    with start_service(settings) as handle:          # 127.0.0.1, a free port
        client = openai.OpenAI(base_url=handle.url, api_key="sk-...")

`serve_forever` is what `rldojo service` runs: SIGTERM and Ctrl-C stop it cleanly
(workers killed, jobs left `running` to resume on the next start).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from rldojo.asgi import run_until_stopped, start_in_thread
from rldojo.service.app import Service, build_service
from rldojo.service.settings import ServiceSettings

__all__ = ["ServiceHandle", "serve_forever", "start_service"]


@dataclass
class ServiceHandle:
    host: str
    port: int
    service: Service
    _server: uvicorn.Server
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.service.close()

    def __enter__(self) -> ServiceHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_service(
    settings: ServiceSettings, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 60.0
) -> ServiceHandle:
    """Serve in a daemon thread; port 0 picks a free port."""
    service = build_service(settings)
    try:
        server, thread, bound = start_in_thread(
            service.app, host, port, start_timeout_s=start_timeout_s, name="rldojo-service"
        )
    except RuntimeError:
        service.close()
        raise
    service.start()
    return ServiceHandle(host, bound, service, server, thread)


def serve_forever(
    settings: ServiceSettings,
    host: str,
    port: int,
    on_ready: Callable[[ServiceHandle], None] | None = None,
) -> None:
    """What `rldojo service` runs: until Ctrl-C or SIGTERM, then workers killed, jobs
    left `running` to resume on the next start."""
    run_until_stopped(start_service(settings, host, port), on_ready)
