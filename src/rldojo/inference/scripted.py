"""`ScriptedEngine`: an engine whose replies are a Python function of the request.

A real server for tests whose answers are exact (a deterministic judge stand-in, a model
that calls a tool on cue), counting every request. Its tokens are whitespace-led words
(`word_pieces`) and its logprobs fixed numbers (`scripted_logprobs`: every token has
probability 1/2). It cannot stream as it samples, having no sampler: `stream` replays the
finished reply token by token.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence

from rldojo.inference.logprobs import scripted_logprobs, word_pieces
from rldojo.inference.protocol import (
    ChatChoice,
    ChatRequest,
    ChatResult,
    ChatStream,
    CompletionRequest,
    CompletionResult,
    PromptEcho,
    RequestError,
)

__all__ = ["ScriptedEngine", "bag_of_letters"]


def bag_of_letters(text: str) -> list[float]:
    """A 26-dim letter-count embedding, L2-normalised: cosines are easy to compute by hand."""
    counts = [0.0] * 26
    for ch in text.lower():
        if "a" <= ch <= "z":
            counts[ord(ch) - ord("a")] += 1.0
    norm = math.sqrt(sum(c * c for c in counts)) or 1.0
    return [c / norm for c in counts]


class ScriptedEngine:
    """Replies with `reply(request)`; records every request (tests count judge calls).

    Completion tokens are the reply's whitespace-led words (`word_pieces`); logprobs,
    when asked for, are `scripted_logprobs` (each token has probability 1/2). A legacy
    completion (/v1/completions) asks `reply` with the prompt as one user message.

    `embed_fn` maps a text to a vector (default: `bag_of_letters`). `delay_s` makes every
    reply wait (timeouts, concurrency limits); `max_in_flight` is the most requests seen
    at once.
    """

    def __init__(
        self,
        reply: Callable[[ChatRequest], str],
        *,
        model: str = "scripted-judge",
        embed_fn: Callable[[str], list[float]] = bag_of_letters,
        delay_s: float = 0.0,
    ) -> None:
        self.model = model
        self.reply = reply
        self.embed_fn = embed_fn
        self.delay_s = delay_s
        self.requests: list[ChatRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def _text(self, request: ChatRequest) -> str:
        with self._lock:
            self.requests.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return self.reply(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def chat(self, request: ChatRequest) -> ChatResult:
        text = await self._text(request)
        pieces = word_pieces(text)
        logprobs = scripted_logprobs(pieces, request.top_logprobs) if request.logprobs else None
        choice = ChatChoice(text, "stop", len(pieces), pieces, logprobs)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in request.messages)
        return ChatResult(choices=[choice] * request.n, prompt_tokens=prompt_tokens)

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        choices: list[ChatChoice] = []
        echoes: list[PromptEcho] = []
        for prompt in request.prompts:
            if not isinstance(prompt, str):
                raise RequestError(
                    "prompt", "token-id prompts need a model with a tokenizer", "unsupported_value"
                )
            if request.max_tokens == 0:
                choices += [ChatChoice("", "length", 0)] * request.n
            else:
                chat = ChatRequest(
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                    n=request.n,
                    seed=request.seed,
                    logprobs=request.logprobs is not None,
                    top_logprobs=request.logprobs or 0,
                )
                choices += (await self.chat(chat)).choices
            if request.echo:
                echoes.append(_echo(prompt, request.logprobs))
        prompt_tokens = sum(len(str(p).split()) for p in request.prompts)
        return CompletionResult(choices, echoes, prompt_tokens)

    async def stream(self, request: ChatRequest | CompletionRequest) -> ChatStream:
        if isinstance(request, ChatRequest):
            return ChatStream.replay(await self.chat(request))
        done = await self.complete(request)
        return ChatStream.replay(ChatResult(done.choices, done.prompt_tokens), done.echoes)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.embed_fn(t) for t in texts]

    def close(self) -> None:
        pass


def _echo(prompt: str, top_k: int | None) -> PromptEcho:
    """The prompt's words as tokens; with logprobs, scripted ones (the first has none)."""
    pieces = word_pieces(prompt)
    if top_k is None:
        return PromptEcho(prompt, pieces)
    scored = scripted_logprobs(pieces, top_k)
    return PromptEcho(prompt, pieces, (None, *scored[1:]) if scored else ())
