"""The OpenAI-compatible HTTP API of `rldojo serve`, over any `ChatEngine`.

Routes (what judges, eval harnesses and OpenAI clients use):

    GET  /v1/models               the one served model
    POST /v1/chat/completions     messages (and tools) -> n choices, whole or streamed
                                  (`rldojo.inference.chat_api`)
    POST /v1/completions          raw prompts or token ids -> n choices, `echo` and legacy
                                  `logprobs` to score prompts (`rldojo.inference.completions`)
    POST /v1/embeddings           texts -> vectors (float or base64, as the openai SDK asks)
    GET  /health                  liveness (never asks for a key)

The model's name is the engine's (the `--model` given) unless `served_model_name` sets
another; a request naming any other model is a 404 with code ``model_not_found``. With
an `api_key`, every /v1 route wants ``Authorization: Bearer <key>`` and answers 401
(code ``invalid_api_key``) without it; without one, nothing is asked.

Errors use OpenAI's shape (`rldojo.inference.errors`), so the openai SDK raises its usual
exceptions; a route this server does not have (/v1/responses) is a 404 in that shape
too. Unknown request fields are accepted and ignored, as vLLM does. With a
`request_log`, every request (but /health) is one line to it (`rldojo.inference.request_log`).
"""

from __future__ import annotations

import base64
import hmac
import re
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from rldojo.inference.chat_api import (
    ChatIn,
    chat_request,
    chat_response,
    invalid_combination,
    streaming_response,
)
from rldojo.inference.completions import (
    CompletionIn,
    completion_request,
    completion_response,
    completion_stream,
    invalid_completion,
)
from rldojo.inference.errors import openai_error, request_error, validation_code
from rldojo.inference.protocol import ChatEngine, RequestError
from rldojo.inference.request_log import RequestLog, counted, request_entry

__all__ = ["build_app"]


class _EmbedIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[str]
    encoding_format: str = "float"


def _encode_vector(vector: list[float], fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def _embedding_response(
    model: str, texts: list[str], vectors: list[list[float]], fmt: str
) -> dict[str, Any]:
    tokens = sum(len(t.split()) for t in texts)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode_vector(v, fmt)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


_UNION_ARM = re.compile(r"^(str|int|float|bool|none)$|[\[\]]")
"""A location part pydantic adds for the arm of a union a value failed (`list[int]`)."""


def _field_path(loc: Sequence[Any]) -> str:
    """The request field a validation error is about, as `tools.0.function.name`."""
    parts = [str(p) for p in loc if p != "body" and not _UNION_ARM.search(str(p))]
    return ".".join(parts)


def _engine_failed(exc: Exception) -> JSONResponse:
    if isinstance(exc, RequestError):
        return request_error(exc)
    return openai_error(500, f"{type(exc).__name__}: {exc}", "server_error")


def _require_key(app: FastAPI, api_key: str) -> None:
    """Every /v1 request must carry ``Authorization: Bearer <api_key>``."""
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_key(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                message = "Incorrect API key provided: pass it as 'Authorization: Bearer <key>'"
                return openai_error(401, message, code="invalid_api_key")
        return await call_next(request)


def _wrong_model(asked: str, name: str) -> JSONResponse | None:
    if asked == name:
        return None
    message = f"The model `{asked}` does not exist; this server serves `{name}`."
    return openai_error(404, message, "invalid_request_error", "model", "model_not_found")


def _generation_routes(app: FastAPI, engine: ChatEngine, name: str) -> None:
    """/v1/chat/completions and /v1/completions: whole replies, or streams."""

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(
        body: ChatIn, request: Request
    ) -> dict[str, Any] | JSONResponse | StreamingResponse:
        (entry := request_entry(request)).model = body.model
        if (wrong := _wrong_model(body.model, name) or invalid_combination(body)) is not None:
            return wrong
        try:
            if body.stream:
                stream = counted(await engine.stream(chat_request(body)), entry)
                return streaming_response(name, stream, body)
            result = await engine.chat(chat_request(body))
        except Exception as exc:  # the engine failed: a 500 the client may retry
            return _engine_failed(exc)
        entry.usage(result.prompt_tokens, result.choices)
        return chat_response(name, result, tools=body.uses_tools())

    @app.post("/v1/completions", response_model=None)
    async def completions(
        body: CompletionIn, request: Request
    ) -> dict[str, Any] | JSONResponse | StreamingResponse:
        (entry := request_entry(request)).model = body.model
        if (wrong := _wrong_model(body.model, name) or invalid_completion(body)) is not None:
            return wrong
        try:
            if body.stream:
                stream = counted(await engine.stream(completion_request(body)), entry)
                return completion_stream(name, stream, body)
            result = await engine.complete(completion_request(body))
        except Exception as exc:
            return _engine_failed(exc)
        entry.usage(result.prompt_tokens, result.choices)
        return completion_response(name, result, body)


def build_app(
    engine: ChatEngine,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    request_log: Callable[[str], Any] | None = None,
) -> FastAPI:
    """The FastAPI app serving `engine` under `served_model_name` (default: `engine.model`);
    `api_key`: the bearer token every /v1 request must carry (None: no check);
    `request_log`: gets one line per request (None: nothing is logged)."""
    app = FastAPI(title="rldojo serve", docs_url=None, redoc_url=None)
    name = served_model_name or engine.model
    started = int(time.time())
    if api_key:
        _require_key(app, api_key)
    if request_log is not None:  # added last, so outermost: a refused key is logged too
        app.add_middleware(RequestLog, emit=request_log)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        where = _field_path(err["loc"]) or None  # None: the body as a whole
        message = f"{where or 'the request body'}: {err['msg']}"
        return openai_error(400, message, "invalid_request_error", where, validation_code(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"  # e.g. /v1/responses
        return openai_error(exc.status_code, message, "invalid_request_error")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": started, "owned_by": "rldojo"}
        return {"object": "list", "data": [card]}

    _generation_routes(app, engine, name)

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings(body: _EmbedIn, request: Request) -> dict[str, Any] | JSONResponse:
        (entry := request_entry(request)).model = body.model
        if (wrong := _wrong_model(body.model, name)) is not None:
            return wrong
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        try:
            vectors = await engine.embed(texts)
        except Exception as exc:
            return _engine_failed(exc)
        reply = _embedding_response(name, texts, vectors, body.encoding_format)
        entry.prompt_tokens, entry.completion_tokens = reply["usage"]["prompt_tokens"], 0
        return reply

    return app
