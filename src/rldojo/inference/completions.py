"""/v1/completions (OpenAI's legacy completions) as JSON: raw prompts, no chat template.

What lm-evaluation-harness's `local-completions` model and other scorers send:

- `prompt`: a string, a list of strings, a list of token ids, or a list of such lists;
  every prompt gets `n` choices, prompt-major (`index` = prompt * n + choice).
- `max_tokens` (default 16, as on OpenAI), `temperature`, `top_p`, `n`, `seed`, `stop`.
- `logprobs: K` (0..20): OpenAI's legacy object per choice, ``{"tokens", "token_logprobs",
  "top_logprobs", "text_offset"}``: per token its text, its raw-model logprob (before
  temperature, `rldojo.inference.logprobs`), a ``{token: logprob}`` map of the K most
  likely tokens plus the chosen one (so up to K + 1 entries, as OpenAI and vLLM), and
  where it starts in the choice's `text`.
- `echo: true`: the choice's `text` starts with the prompt, and with `logprobs` the
  prompt's tokens come first in the object, each scored given the ones before it (the
  first has ``null`` logprob and top_logprobs). With `max_tokens: 0` nothing is
  generated: the prompt's log-likelihood alone, which is how harnesses score the
  continuations of a multiple-choice question.
- `stream: true`: `text_completion` chunks as the tokens are sampled (with `echo`, the
  prompt first), `stream_options.include_usage`, ``data: [DONE]``.

Not supported, a 400 naming the field: `suffix` (insertion), `best_of` other than 1 or
`n` (no ranking of extra samples), and `echo` with `logprobs` on a stream (the prompt's
scores need a pass of their own; ask without `stream`).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rldojo.inference.errors import bad_request
from rldojo.inference.logprobs import TokenLogprob
from rldojo.inference.protocol import (
    ChatChoice,
    ChatStream,
    CompletionRequest,
    CompletionResult,
    PromptEcho,
    TokenEvent,
    stop_strings,
)
from rldojo.inference.streaming import StreamOptions, sse_stream, usage_counts

__all__ = [
    "CompletionIn",
    "completion_request",
    "completion_response",
    "completion_stream",
    "invalid_completion",
    "legacy_logprobs",
]


class CompletionIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    """Text, texts, token ids, or lists of token ids; each prompt gets `n` choices."""
    max_tokens: int | None = Field(16, ge=0)
    """0 only with `echo`: the prompt is scored, nothing generated; bounded by the
    engine's context window (`invalid_value` past it)."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    """Most likely alternatives per token in the legacy logprobs object (None: none)."""
    echo: bool | None = False
    """Return the prompt before the completion (scored too, with `logprobs`)."""
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    """Not supported (a 400 when set): no insertion."""
    best_of: int | None = None
    """Only 1 or `n` (no ranking of extra samples)."""

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per entry: a string or a token-id list."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        ids = [t for t in p if isinstance(t, int)]
        if p and len(ids) == len(p):  # one prompt of token ids
            return [ids]
        return [t for t in p if not isinstance(t, int)]


def invalid_completion(body: CompletionIn) -> JSONResponse | None:
    """What the schema cannot say: empty prompts, fields valid alone but not together,
    and the fields this server does not support (see the module docstring)."""
    if body.prompt == [] or any(p == [] for p in body.prompts()):
        return bad_request("prompt", "must not be empty", "empty_array")
    if body.max_tokens == 0 and not body.echo:
        message = "0 is only allowed with echo (to score the prompt)"
        return bad_request("max_tokens", message, "integer_below_min_value")
    if body.suffix:
        message = "not supported: rldojo serve does not insert text"
        return bad_request("suffix", message, "unsupported_parameter")
    if body.best_of is not None and body.best_of not in (1, body.n):
        message = "not supported: only best_of = 1 or n (no ranking)"
        return bad_request("best_of", message, "unsupported_value")
    if body.stream_options is not None and not body.stream:
        return bad_request("stream_options", "stream_options is only allowed when stream is true")
    if body.stream and body.echo and body.logprobs is not None:
        message = "echo with logprobs is not streamed: ask with stream false"
        return bad_request("stream", message, "unsupported_value")
    return None


def completion_request(body: CompletionIn) -> CompletionRequest:
    return CompletionRequest(
        prompts=body.prompts(),
        max_tokens=16 if body.max_tokens is None else body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        seed=body.seed,
        stop=stop_strings(body.stop),
        logprobs=body.logprobs,
        echo=bool(body.echo),
    )


def _top(entry: TokenLogprob) -> dict[str, float]:
    """The K most likely tokens, and the chosen one if it is not among them."""
    top = dict(entry.top)
    top.setdefault(entry.token, entry.logprob)
    return top


def legacy_logprobs(
    pieces: Sequence[str], entries: Sequence[TokenLogprob | None]
) -> dict[str, Any]:
    """OpenAI's legacy `logprobs` object; `None` entries (a prompt's first token) have
    null logprob and top_logprobs. `text_offset` counts from the start of the text."""
    offsets = [0, *itertools.accumulate(len(p) for p in pieces)][: len(pieces)]
    return {
        "tokens": list(pieces),
        "token_logprobs": [e.logprob if e is not None else None for e in entries],
        "top_logprobs": [_top(e) if e is not None else None for e in entries],
        "text_offset": offsets,
    }


def _choice_json(
    index: int, choice: ChatChoice, echo: PromptEcho | None, logprobs: bool
) -> dict[str, Any]:
    text = (echo.text if echo else "") + choice.text
    out: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": choice.finish_reason,
    }
    if logprobs:
        pieces = [*(echo.pieces if echo else ()), *choice.pieces]
        entries = [*(echo.logprobs or () if echo else ()), *(choice.logprobs or ())]
        out["logprobs"] = legacy_logprobs(pieces, entries)
    return out


def completion_response(model: str, result: CompletionResult, body: CompletionIn) -> dict[str, Any]:
    n, echoes = body.n, result.echoes
    choices = [
        _choice_json(i, c, echoes[i // n] if echoes else None, body.logprobs is not None)
        for i, c in enumerate(result.choices)
    ]
    completion_tokens = sum(c.completion_tokens for c in result.choices)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_counts(result.prompt_tokens, completion_tokens),
    }


def completion_stream(model: str, stream: ChatStream, body: CompletionIn) -> StreamingResponse:
    """`text_completion` chunks as the tokens are sampled; with `echo`, each choice's
    first chunk is its prompt."""
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def wrap(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> dict[str, Any]:
        out = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
        }
        return out | {"usage": usage} if include_usage else out

    def chunk(event: TokenEvent) -> list[dict[str, Any]]:
        logprobs = None
        if event.logprob is not None:
            logprobs = legacy_logprobs([event.piece or ""], [event.logprob])
        return [
            {
                "index": event.index,
                "text": event.piece or "",
                "logprobs": logprobs,
                "finish_reason": event.finish_reason,
            }
        ]

    first = [
        {
            "index": i,
            "text": stream.echoes[i // body.n].text,
            "logprobs": None,
            "finish_reason": None,
        }
        for i in range(stream.choices)
        if stream.echoes
    ]
    events = sse_stream(stream, first, chunk, wrap, include_usage)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
