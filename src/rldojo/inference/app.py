"""The OpenAI-compatible HTTP API of `rldojo serve`, over any `ChatEngine`.

Routes (the subset judges and eval clients use):

    GET  /v1/models               the one served model
    POST /v1/chat/completions     messages -> n choices, with usage token counts
    POST /v1/embeddings           texts -> vectors (float or base64, as the openai SDK asks)
    GET  /health                  liveness

Chat completions follow OpenAI's API, including:

- `logprobs: true` (and `top_logprobs: K`, 0..20): each choice gets
  ``logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}``, one
  entry per completion token, from the raw model distribution (before temperature and
  top_p, as vLLM does by default; `rldojo.inference.logprobs`). `top_logprobs` without
  `logprobs: true` is a 400, as on OpenAI.
- `stream: true`: server-sent `chat.completion.chunk` events, `stream_options:
  {"include_usage": true}` and a final ``data: [DONE]`` (`rldojo.inference.streaming`). The
  reply is generated whole, then sent token by token.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so the
openai SDK raises its usual exceptions (`BadRequestError`, `NotFoundError`). Unknown
request fields are accepted and ignored, as vLLM does.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rldojo.inference.engine import ChatEngine, ChatRequest, ChatResult
from rldojo.inference.logprobs import logprobs_json
from rldojo.inference.streaming import sse_events, usage_json

__all__ = ["MAX_TOKENS_DEFAULT", "build_app"]

MAX_TOKENS_DEFAULT = 256
"""Completion tokens when the request names no limit (vLLM uses the context length)."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "text"
    text: str = ""


class _MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_Part] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if p.type in ("text", "input_text"))


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class ChatIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[_MessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0, le=8192)
    max_completion_tokens: int | None = Field(None, gt=0, le=8192)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class _EmbedIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[str]
    encoding_format: str = "float"


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def chat_request(body: ChatIn) -> ChatRequest:
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])
    return ChatRequest(
        messages=[{"role": _role(m.role), "content": m.text()} for m in body.messages],
        max_tokens=body.max_completion_tokens or body.max_tokens or MAX_TOKENS_DEFAULT,
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        seed=body.seed,
        stop=tuple(s for s in stop if s),
        model=body.model,
        logprobs=bool(body.logprobs),
        top_logprobs=body.top_logprobs or 0,
    )


def invalid_combination(body: ChatIn) -> JSONResponse | None:
    """Fields that are valid alone but not together (OpenAI and vLLM reject these too)."""
    if body.top_logprobs is not None and not body.logprobs:
        message = "top_logprobs requires logprobs to be true"
        return _error(400, message, "invalid_request_error", "top_logprobs")
    if body.stream_options is not None and not body.stream:
        message = "stream_options is only allowed when stream is true"
        return _error(400, message, "invalid_request_error", "stream_options")
    return None


def _encode_vector(vector: list[float], fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def chat_response(model: str, result: ChatResult) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "logprobs": logprobs_json(c.logprobs) if c.logprobs is not None else None,
            }
            for i, c in enumerate(result.choices)
        ],
        "usage": usage_json(result),
    }


def stream_response(model: str, result: ChatResult, body: ChatIn) -> StreamingResponse:
    events = sse_events(
        result,
        completion_id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


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


def build_app(engine: ChatEngine) -> FastAPI:
    """The FastAPI app serving `engine` under the name `engine.model`."""
    app = FastAPI(title="rldojo serve", docs_url=None, redoc_url=None)
    started = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"] if p != "body")
        return _error(400, f"{where}: {err['msg']}", "invalid_request_error", where)

    def _check_model(name: str) -> JSONResponse | None:
        if name != engine.model:
            return _error(
                404,
                f"The model `{name}` does not exist; this server serves `{engine.model}`.",
                "NotFoundError",
                "model",
            )
        return None

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": engine.model, "object": "model", "created": started, "owned_by": "rldojo"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatIn) -> dict[str, Any] | JSONResponse | StreamingResponse:
        if (wrong := _check_model(body.model) or invalid_combination(body)) is not None:
            return wrong
        try:
            result = await engine.chat(chat_request(body))
        except Exception as exc:  # the engine failed: a 500 the client may retry
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
        if body.stream:
            return stream_response(engine.model, result, body)
        return chat_response(engine.model, result)

    @app.post("/v1/embeddings", response_model=None)
    async def embeddings(body: _EmbedIn) -> dict[str, Any] | JSONResponse:
        if (wrong := _check_model(body.model)) is not None:
            return wrong
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        try:
            vectors = await engine.embed(texts)
        except Exception as exc:
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")
        return _embedding_response(engine.model, texts, vectors, body.encoding_format)

    return app
