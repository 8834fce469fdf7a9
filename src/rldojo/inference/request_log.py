"""The request log of `rldojo serve`: one line per request once its reply has been sent
(a stream's once its last event has gone), as uvicorn's access log and vLLM print them,
with what an operator of a model server reads too: the model asked for, the tokens
counted as in the reply's `usage`, and the time taken.

    POST /v1/chat/completions 200 model=my-policy prompt_tokens=31 completion_tokens=12 0.412s

``-`` stands for what a request did not get to (a 400 before its body was read, a route
without tokens). ``GET /health`` is not logged: a liveness probe would drown the rest.
Uvicorn's own access log stays off (`rldojo.asgi`), so a request is one line.

`RequestLog` is the ASGI middleware that times each request and writes its line; the
routes fill in what they know through `request_entry` and `counted`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rldojo.inference.protocol import ChatChoice, ChatStream, TokenEvent

__all__ = ["RequestEntry", "RequestLog", "counted", "request_entry"]

_STATE_KEY = "request_log"
"""Where a request's entry lives in its ASGI scope's state (`request.state`)."""


@dataclass
class RequestEntry:
    """What one request's log line says, filled in as the request goes."""

    method: str
    path: str
    status: int = 500
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def usage(self, prompt_tokens: int, choices: Sequence[ChatChoice]) -> None:
        """The token counts of a whole reply, as its `usage` has them."""
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = sum(c.completion_tokens for c in choices)

    def line(self, seconds: float) -> str:
        def shown(value: object) -> str:
            return "-" if value is None else str(value)

        return (
            f"{self.method} {self.path} {self.status} model={shown(self.model)} "
            f"prompt_tokens={shown(self.prompt_tokens)} "
            f"completion_tokens={shown(self.completion_tokens)} {seconds:.3f}s"
        )


def request_entry(request: Request) -> RequestEntry:
    """The request's log entry (a detached one where the app keeps no log)."""
    entry = request.scope.get("state", {}).get(_STATE_KEY)
    return entry if isinstance(entry, RequestEntry) else RequestEntry(request.method, "")


def counted(stream: ChatStream, entry: RequestEntry) -> ChatStream:
    """`stream`, counting its tokens into `entry` as they are sent."""
    entry.prompt_tokens, entry.completion_tokens = stream.prompt_tokens, 0
    events = stream.events

    async def counting() -> AsyncIterator[TokenEvent]:
        async for event in events:
            entry.completion_tokens = (entry.completion_tokens or 0) + (event.piece is not None)
            yield event

    stream.events = counting()
    return stream


class RequestLog:
    """ASGI middleware: each HTTP request's line to `emit` once its reply is sent, or
    failed (then with status 500); `quiet` paths are not logged."""

    def __init__(
        self, app: ASGIApp, emit: Callable[[str], Any], quiet: Sequence[str] = ("/health",)
    ) -> None:
        self.app, self.emit, self.quiet = app, emit, tuple(quiet)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.quiet:
            await self.app(scope, receive, send)
            return
        entry = RequestEntry(scope["method"], scope["path"])
        scope.setdefault("state", {})[_STATE_KEY] = entry
        started, done = time.perf_counter(), False

        def finish() -> None:
            nonlocal done
            if not done:
                done = True
                self.emit(entry.line(time.perf_counter() - started))

        async def logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry.status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finish()

        try:
            await self.app(scope, receive, logged)
        finally:
            finish()  # an error, or a reply cut off: logged all the same
