"""`stream: true`: a `ChatStream` as OpenAI's server-sent events, sent as tokens are sampled.

`TransformersEngine.stream` yields each token as the sampler draws it, so the first
chunk leaves while the reply is still being generated; an engine that cannot stream
(`ScriptedEngine`, the fine-tuning service's replay) hands a finished reply over as a
stream (`ChatStream.replay`) and the wire format is the same. The deltas join to the
non-streaming content.

The chat stream (/v1/chat/completions), each event a ``data: <json>\\n\\n`` line:

1. per choice, a `chat.completion.chunk` whose delta is ``{"role": "assistant",
   "content": ""}``;
2. per completion token, a chunk whose delta is ``{"content": piece}``, with that
   token's ``logprobs: {"content": [entry]}`` when the request asked for logprobs;
   choices interleave as they are sampled, each chunk naming its choice's `index`. A
   choice's last token chunk carries its `finish_reason` (as vLLM sends it; a choice
   with no tokens gets a chunk with an empty delta instead);
3. with tools offered, text from ``<tool_call>`` on is held back; at the end the calls
   go in one chunk, ``{"tool_calls": [...]}`` with finish_reason ``tool_calls``
   (`rldojo.inference.chat_tools`);
4. with ``stream_options: {"include_usage": true}``, every chunk above has
   ``usage: null`` and a last chunk has empty `choices` and the request's `usage`;
5. ``data: [DONE]``.

An engine error before the first token is an ordinary JSON error (the engine raises
from `stream` itself); one midway is a last ``data: {"error": {...}}`` event before
``[DONE]``, which the openai SDK raises as an `APIError`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from rldojo.inference.chat_tools import TOOL_CALL_OPEN, split_tool_calls
from rldojo.inference.logprobs import logprobs_json
from rldojo.inference.protocol import ChatResult, ChatStream, TokenEvent
from rldojo.inference.token_stream import releasable

__all__ = ["StreamOptions", "chat_events", "sse", "sse_stream", "usage_counts", "usage_json"]


class StreamOptions(BaseModel):
    """A request's `stream_options` (chat and completions): `include_usage` sends a last
    chunk with the token counts."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


def usage_json(result: ChatResult) -> dict[str, int]:
    """OpenAI's `usage` object: prompt tokens once, completion tokens of all choices."""
    completion_tokens = sum(c.completion_tokens for c in result.choices)
    return usage_counts(result.prompt_tokens, completion_tokens)


def usage_counts(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event."""
    body = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {body}\n\n"


async def sse_stream(
    stream: ChatStream,
    first: list[dict[str, Any]],
    chunk: Callable[[TokenEvent], list[dict[str, Any]]],
    wrap: Callable[[list[dict[str, Any]], dict[str, int] | None], dict[str, Any]],
    include_usage: bool,
) -> AsyncIterator[str]:
    """The events of a stream: `first` choice entries, then `chunk(event)`'s entries per
    token, each wrapped (`wrap(choices, usage)`) in its own event; then the usage (when
    asked for), an error if generation failed midway, and ``[DONE]``."""
    completion_tokens = 0
    try:
        for entry in first:
            yield sse(wrap([entry], None))
        async for event in stream.events:
            completion_tokens += event.piece is not None
            for entry in chunk(event):
                yield sse(wrap([entry], None))
    except Exception as exc:  # generation failed midway: the status line is long gone
        error = {
            "message": f"{type(exc).__name__}: {exc}",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        yield sse({"error": error})
    else:
        if include_usage:
            yield sse(wrap([], usage_counts(stream.prompt_tokens, completion_tokens)))
    yield sse("[DONE]")


@dataclass
class _ToolHold:
    """One choice's text with tools offered: released up to ``<tool_call>``, the calls
    parsed when the choice ends."""

    text: str = ""
    sent: int = 0

    def add(self, piece: str) -> str:
        self.text += piece
        upto = releasable(self.text, (TOOL_CALL_OPEN,))
        out = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return out

    def end(self) -> tuple[str, list[dict[str, Any]]]:
        """The content not yet sent, and the reply's tool calls."""
        content, calls = split_tool_calls(self.text)
        content = content or ""
        rest = content[self.sent :] if content.startswith(self.text[: self.sent]) else ""
        return rest, calls


def chat_events(
    stream: ChatStream,
    *,
    completion_id: str,
    created: int,
    model: str,
    include_usage: bool,
    tools: bool = False,
) -> AsyncIterator[str]:
    """The server-sent events of a chat stream (see the module docstring); `tools`: the
    request offered tools, so ``<tool_call>`` tags in the reply become `tool_calls`."""
    holds = [_ToolHold() for _ in range(stream.choices)] if tools else []

    def wrap(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> dict[str, Any]:
        out = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        return out | {"usage": usage} if include_usage else out

    def chunk(event: TokenEvent) -> list[dict[str, Any]]:
        logprobs = logprobs_json([event.logprob]) if event.logprob is not None else None
        entry: dict[str, Any] = {
            "index": event.index,
            "delta": {},
            "logprobs": logprobs,
            "finish_reason": event.finish_reason,
        }
        if event.piece is None:  # no token: the choice only ends
            return [entry]
        if not holds:
            entry["delta"] = {"content": event.piece}
            return [entry]
        hold = holds[event.index]
        content = hold.add(event.piece)
        entry["delta"] = {"content": content}
        if event.finish_reason is None:
            return [entry]
        rest, calls = hold.end()
        entry["delta"] = {"content": content + rest}
        if not calls:
            return [entry]
        entry["finish_reason"] = None
        deltas = [{"index": j, **call} for j, call in enumerate(calls)]
        last = {
            "index": event.index,
            "delta": {"tool_calls": deltas},
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
        return [entry, last]

    role = [
        {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        for i in range(stream.choices)
    ]
    return sse_stream(stream, role, chunk, wrap, include_usage)
