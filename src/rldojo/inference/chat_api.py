"""/v1/chat/completions as JSON: the request body, its checks, and the reply (whole or
streamed). Shared by `rldojo serve` (`rldojo.inference.app`) and the fine-tuning service.

Follows OpenAI's API, including:

- `logprobs: true` (and `top_logprobs: K`, 0..20): each choice gets
  ``logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}``, one
  entry per completion token, from the raw model distribution (before temperature and
  top_p, as vLLM does by default; `rldojo.inference.logprobs`). `top_logprobs` without
  `logprobs: true` is a 400, as on OpenAI.
- `stream: true`: server-sent `chat.completion.chunk` events as the tokens are sampled,
  `stream_options: {"include_usage": true}` and a final ``data: [DONE]``
  (`rldojo.inference.streaming`).
- `tools` (function schemas) and `tool_choice` (`auto`, the default with tools, or
  `none`): the tools are rendered into the prompt, and ``<tool_call>`` tags in the reply
  come back as the message's `tool_calls`, with finish_reason ``tool_calls``
  (`rldojo.inference.chat_tools`). Assistant messages with `tool_calls` and ``tool``
  messages in the conversation are rendered as the model would have written and read
  them. `tool_choice: "required"` or a named function would need constrained decoding,
  which this server does not have: a 400.

Unknown request fields are accepted and ignored, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rldojo.inference.chat_tools import assistant_text, split_tool_calls
from rldojo.inference.errors import bad_request
from rldojo.inference.logprobs import logprobs_json
from rldojo.inference.protocol import ChatRequest, ChatResult, ChatStream, stop_strings
from rldojo.inference.streaming import StreamOptions, chat_events, usage_json

__all__ = [
    "MAX_TOKENS_DEFAULT",
    "ChatIn",
    "chat_request",
    "chat_response",
    "invalid_combination",
    "stream_response",
    "streaming_response",
]

MAX_TOKENS_DEFAULT = 256
"""Completion tokens when the request names no limit, or fewer where the context window
leaves fewer after the prompt (vLLM uses all that is left)."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "text"
    text: str = ""


class _CalledFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCallIn(BaseModel):
    """A call of an earlier assistant turn, as OpenAI's clients send it back."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: _CalledFunction


class _MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_Part] | None = None
    tool_calls: list[_ToolCallIn] | None = None

    def text(self) -> str:
        """The content as the model reads it: text parts joined, an assistant turn's
        tool calls written out as ``<tool_call>`` JSON after its text."""
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(p.text for p in self.content if p.type in ("text", "input_text"))
        calls = [(c.function.name, c.function.arguments) for c in self.tool_calls or []]
        return assistant_text(text, calls)


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    """As on OpenAI: letters, digits, underscores and dashes, at most 64."""
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _ToolIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: _Function


class ChatIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[_MessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    """Bounded by the engine's context window (`invalid_value` past it)."""
    max_completion_tokens: int | None = Field(None, gt=0)
    """OpenAI's newer name of `max_tokens`; it wins when both are sent."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[_ToolIn] | None = None
    """Function schemas the model may call (rendered into the prompt)."""
    tool_choice: str | dict[str, Any] | None = None
    """`auto` (the default with tools) or `none` (tools neither rendered nor parsed)."""

    def uses_tools(self) -> bool:
        """Tools offered and not switched off (`tool_choice: "none"`)."""
        return bool(self.tools) and self.tool_choice != "none"


def _role(role: str) -> str:
    return "system" if role == "developer" else role


def chat_request(body: ChatIn) -> ChatRequest:
    tools = (
        tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
        if body.uses_tools()
        else ()
    )
    field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    max_tokens = body.max_completion_tokens or body.max_tokens
    return ChatRequest(
        messages=[{"role": _role(m.role), "content": m.text()} for m in body.messages],
        max_tokens=max_tokens or MAX_TOKENS_DEFAULT,
        max_tokens_field=field,
        max_tokens_default=max_tokens is None,
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        seed=body.seed,
        stop=stop_strings(body.stop),
        model=body.model,
        logprobs=bool(body.logprobs),
        top_logprobs=body.top_logprobs or 0,
        tools=tools,
    )


def invalid_combination(body: ChatIn) -> JSONResponse | None:
    """Fields that are valid alone but not together (OpenAI and vLLM reject these too),
    and the `tool_choice` values this server cannot honour."""
    if body.top_logprobs is not None and not body.logprobs:
        return bad_request("top_logprobs", "top_logprobs requires logprobs to be true")
    if body.stream_options is not None and not body.stream:
        return bad_request("stream_options", "stream_options is only allowed when stream is true")
    choice = body.tool_choice
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        return bad_request("tool_choice", f"expected 'auto', 'none' or 'required', got {choice!r}")
    if choice == "required" or isinstance(choice, dict):
        wanted = "'required'" if choice == "required" else "a named function"
        message = (
            f"{wanted} is not supported: rldojo serve has no constrained decoding; "
            "use 'auto' or 'none'"
        )
        return bad_request("tool_choice", message, "unsupported_value")
    return None


def chat_response(model: str, result: ChatResult, *, tools: bool = False) -> dict[str, Any]:
    """The whole reply; `tools`: the request offered tools, so the replies' ``<tool_call>``
    tags become `tool_calls`."""
    choices = []
    for i, c in enumerate(result.choices):
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        reason = c.finish_reason
        if tools and (split := split_tool_calls(c.text))[1]:
            message = {"role": "assistant", "content": split[0], "tool_calls": split[1]}
            reason = "tool_calls"
        logprobs = logprobs_json(c.logprobs) if c.logprobs is not None else None
        choices.append(
            {"index": i, "message": message, "finish_reason": reason, "logprobs": logprobs}
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_json(result),
    }


def streaming_response(model: str, stream: ChatStream, body: ChatIn) -> StreamingResponse:
    """The reply as server-sent events, each sent as its token is sampled."""
    events = chat_events(
        stream,
        completion_id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        tools=body.uses_tools(),
    )
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def stream_response(model: str, result: ChatResult, body: ChatIn) -> StreamingResponse:
    """A finished reply as server-sent events (an engine that cannot stream)."""
    return streaming_response(model, ChatStream.replay(result), body)
