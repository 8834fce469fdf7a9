"""`stream: true` on /v1/chat/completions: a finished `ChatResult` as OpenAI's SSE chunks.

The engine generates the whole reply first; this module then replays it token by token
(the sampler has no per-step callback), so the first chunk arrives when generation is
done, but the wire format is OpenAI's and the deltas join to the non-streaming content.
An engine error therefore still comes back as an ordinary JSON error, never mid-stream.

The stream, each event a ``data: <json>\\n\\n`` line:

1. per choice, a `chat.completion.chunk` whose delta is ``{"role": "assistant",
   "content": ""}``;
2. per completion token (`ChatChoice.pieces`), a chunk whose delta is
   ``{"content": piece}``, with that token's ``logprobs: {"content": [entry]}`` when
   the request asked for logprobs; choices interleave, token by token, each chunk naming
   its choice's `index`. A choice's last token chunk carries its `finish_reason` (as
   vLLM sends it; a choice with no tokens gets a chunk with an empty delta instead);
3. with ``stream_options: {"include_usage": true}``, every chunk above has
   ``usage: null`` and a last chunk has empty `choices` and the request's `usage`;
4. ``data: [DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from rldojo.inference.engine import ChatChoice, ChatResult
from rldojo.inference.logprobs import logprobs_json

__all__ = ["sse_events", "usage_json"]


def usage_json(result: ChatResult) -> dict[str, int]:
    """OpenAI's `usage` object: prompt tokens once, completion tokens of all choices."""
    completion_tokens = sum(c.completion_tokens for c in result.choices)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": result.prompt_tokens + completion_tokens,
    }


def _pieces(choice: ChatChoice) -> tuple[str, ...]:
    """The choice's token texts; one piece with the whole text if the engine gave none."""
    if choice.pieces or not choice.text:
        return choice.pieces
    return (choice.text,)


def _choice_deltas(index: int, choice: ChatChoice) -> list[dict[str, Any]]:
    """The `choices[0]` entries this choice streams, in order."""
    deltas: list[dict[str, Any]] = [
        {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    pieces = _pieces(choice)
    for pos, piece in enumerate(pieces):
        logprobs = None
        if choice.logprobs is not None and pos < len(choice.logprobs):
            logprobs = logprobs_json(choice.logprobs[pos : pos + 1])
        last = pos == len(pieces) - 1
        deltas.append(
            {
                "index": index,
                "delta": {"content": piece},
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason if last else None,
            }
        )
    if not pieces:
        deltas.append(
            {"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.finish_reason}
        )
    return deltas


def _interleaved(result: ChatResult) -> Iterator[dict[str, Any]]:
    """Choice entries round-robin: every choice's first entry, then every second, ..."""
    streams = [_choice_deltas(i, c) for i, c in enumerate(result.choices)]
    for step in range(max((len(s) for s in streams), default=0)):
        for entries in streams:
            if step < len(entries):
                yield entries[step]


def sse_events(
    result: ChatResult,
    *,
    completion_id: str,
    created: int,
    model: str,
    include_usage: bool,
) -> Iterator[str]:
    """The server-sent events of `result`, ``[DONE]`` included (see the module docstring)."""

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> str:
        chunk: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if include_usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    for entry in _interleaved(result):
        yield event([entry], None)
    if include_usage:
        yield event([], usage_json(result))
    yield "data: [DONE]\n\n"
