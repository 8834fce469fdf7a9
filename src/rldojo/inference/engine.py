"""Chat engines behind `rldojo serve`: a local transformers model, or a scripted stand-in.

An engine answers one chat request (messages + sampling) with `n` choices and token
counts, and embeds texts. Each choice carries the text each completion token adds (what
`stream: true` sends, token by token) and, when the request asks for logprobs, each
token's log-probability and top alternatives (`rldojo.inference.logprobs` says which
distribution). The HTTP layer (`rldojo.inference.app`) only translates JSON.

`TransformersEngine` generates with `TransformersPolicy` on one worker thread. Requests
that arrive within `batch_window_s` of each other and sample the same way are decoded as
one batch (the cached sampler's cost per step barely grows with the batch on CPU), so a
judge grading many samples concurrently gets batched generation for free. A request with
a seed and a temperature above 0 is decoded alone, so its output depends only on the
request, never on what it was batched with. Requests with and without logprobs share
batches: the logprobs are computed per choice after the batch is decoded.

`ScriptedEngine` replies with a Python function of the request: a real server for tests
whose answers are exact (a deterministic judge stand-in), counting every request. Its
tokens are whitespace-led words and its logprobs fixed numbers (`scripted_logprobs`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rldojo.inference.logprobs import (
    TokenLogprob,
    score_tokens,
    scripted_logprobs,
    token_pieces,
    word_pieces,
)
from rldojo.types import Completion, Message, SamplingParams

__all__ = [
    "ChatChoice",
    "ChatEngine",
    "ChatRequest",
    "ChatResult",
    "ScriptedEngine",
    "TokenLogprob",
    "TransformersEngine",
    "bag_of_letters",
]


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request, already validated by the HTTP layer."""

    messages: list[Message]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    model: str = ""
    logprobs: bool = False
    """Report each completion token's log-probability (`ChatChoice.logprobs`)."""
    top_logprobs: int = 0
    """With `logprobs`: how many most likely alternatives to report per token (0..20)."""


@dataclass(frozen=True)
class ChatChoice:
    text: str
    finish_reason: str
    """`stop` (end of turn or a stop string) or `length` (max_tokens reached)."""
    completion_tokens: int
    pieces: tuple[str, ...] = ()
    """The text each completion token adds; they join to `text` (empty: not reported)."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Per completion token, when the request asked for logprobs; else None."""


@dataclass(frozen=True)
class ChatResult:
    choices: list[ChatChoice]
    prompt_tokens: int


class ChatEngine(Protocol):
    """What the server needs from a model."""

    model: str

    async def chat(self, request: ChatRequest) -> ChatResult: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------- transformers


@dataclass
class _Job:
    kind: str  # "chat" | "embed"
    future: concurrent.futures.Future[Any]
    prompt: list[int] = field(default_factory=list)
    n: int = 1
    sampling: SamplingParams | None = None
    texts: Sequence[str] = ()
    top_logprobs: int | None = None  # None: no logprobs asked for

    @property
    def key(self) -> tuple[Any, ...] | None:
        """Jobs with equal non-None keys may share one batch."""
        s = self.sampling
        if self.kind != "chat" or s is None:
            return None
        if not s.greedy and s.seed is not None:
            return None  # seeded sampling: alone, so the output depends on this request only
        return (s.max_new_tokens, s.temperature if not s.greedy else 0.0, s.top_p, s.stop)


class TransformersEngine:
    """A local transformers model served from one worker thread with request batching.

    Args:
        model_name: built-in name (`tiny-random`, `smollm2-135m-instruct`) or directory.
        dtype: generation dtype, `auto` (bf16 where measured faster on this machine,
            see `rldojo.hardware.precision`), `bfloat16` or `float32`.
        max_batch: most sequences decoded together.
        batch_window_s: how long the worker waits for more requests to join a batch.
        model, tokenizer: an already loaded pair (then `model_name` only names it).
    """

    def __init__(
        self,
        model_name: str = "tiny-random",
        *,
        dtype: str = "auto",
        max_batch: int = 16,
        batch_window_s: float = 0.005,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        import torch

        from rldojo.policy.models import load_model
        from rldojo.policy.transformers_backend import TransformersPolicy

        if dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {dtype!r}")
        if model is None:
            model, tokenizer = load_model(model_name)
        gen_dtype = {"bfloat16": torch.bfloat16, "float32": None}.get(dtype, "auto")
        self.model = model_name
        self.policy = TransformersPolicy(model, tokenizer, generation_dtype=gen_dtype)
        self._gen_model = self.policy._gen_model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self._jobs: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.batches: list[int] = []
        """Sequences per decoded batch, for tests and throughput notes."""
        self._thread = threading.Thread(target=self._work, name="rldojo-engine", daemon=True)
        self._thread.start()

    async def chat(self, request: ChatRequest) -> ChatResult:
        import asyncio

        prompt = self.policy.encode_chat(request.messages)
        sampling = SamplingParams(
            max_new_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=request.stop,
            seed=request.seed,
        )
        job = _Job("chat", concurrent.futures.Future(), prompt, request.n, sampling)
        if request.logprobs:
            job.top_logprobs = request.top_logprobs
        self._submit(job)
        choices = await asyncio.wrap_future(job.future)
        return ChatResult(choices=choices, prompt_tokens=len(prompt))

    def complete_ids(
        self, prompt: list[int], n: int, sampling: SamplingParams, *, timeout_s: float = 600
    ) -> list[Any]:
        """`n` completions of raw prompt token ids (no chat template), batched with the
        other requests on the engine's worker thread; blocks until they are done."""
        job = _Job("chat", concurrent.futures.Future(), list(prompt), n, sampling)
        self._submit(job)
        return list(job.future.result(timeout=timeout_s))

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        import asyncio

        job = _Job("embed", concurrent.futures.Future(), texts=list(texts))
        self._submit(job)
        return await asyncio.wrap_future(job.future)  # type: ignore[no-any-return]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _submit(self, job: _Job) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._jobs.append(job)
            self._cond.notify()

    def _take_batch(self) -> list[_Job] | None:
        """The next job plus compatible jobs that arrive within the batch window."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = self._jobs.popleft()
            if first.key is None:
                return [first]
            batch, rows = [first], first.n
            deadline = time.monotonic() + self.batch_window_s
            while rows < self.max_batch:
                match = next((j for j in self._jobs if j.key == first.key), None)
                if match is not None and rows + match.n <= self.max_batch:
                    self._jobs.remove(match)
                    batch.append(match)
                    rows += match.n
                    continue
                left = deadline - time.monotonic()
                if match is not None or left <= 0:
                    break
                self._cond.wait(left)
            return batch

    def _work(self) -> None:
        while (batch := self._take_batch()) is not None:
            try:
                if batch[0].kind == "embed":
                    batch[0].future.set_result(self._embed(batch[0].texts))
                else:
                    self._generate(batch)
            except BaseException as exc:  # report to the callers, keep serving
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)

    def _generate(self, batch: list[_Job]) -> None:
        prompts = [job.prompt for job in batch for _ in range(job.n)]
        sampling = batch[0].sampling
        assert sampling is not None
        if sampling.greedy:
            sampling = replace(sampling, seed=None)
        completions = self.policy.generate(prompts, sampling)
        self.batches.append(len(prompts))
        start = 0
        for job in batch:
            mine = completions[start : start + job.n]
            start += job.n
            job.future.set_result([self._choice(job, c) for c in mine])

    def _choice(self, job: _Job, c: Completion) -> ChatChoice:
        pieces = token_pieces(self.tokenizer, c.token_ids, c.text)
        logprobs = None
        if job.top_logprobs is not None:
            logprobs = score_tokens(
                self._gen_model, self.tokenizer, job.prompt, c.token_ids, pieces, job.top_logprobs
            )
        reason = "stop" if c.finish_reason == "stop" else "length"
        return ChatChoice(c.text, reason, len(c.token_ids), pieces, logprobs)

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Mean-pooled last hidden state, L2-normalised (like hosted embedding APIs)."""
        import torch

        rows: list[list[float]] = []
        with torch.no_grad():
            for text in texts:
                ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
                ids = ids["input_ids"][:, :2048]
                if ids.shape[1] == 0:
                    ids = torch.tensor([[self.tokenizer.eos_token_id]])
                out = self._gen_model(input_ids=ids, output_hidden_states=True)
                vector = out.hidden_states[-1][0].float().mean(0)  # [H]
                rows.append(torch.nn.functional.normalize(vector, dim=0).tolist())
        return rows

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
        for job in pending:
            job.future.set_exception(RuntimeError("engine closed"))
        self._thread.join(timeout=30)


# ----------------------------------------------------------------------------- scripted


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
    when asked for, are `scripted_logprobs` (each token has probability 1/2).

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

    async def chat(self, request: ChatRequest) -> ChatResult:
        import asyncio

        with self._lock:
            self.requests.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            text = self.reply(request)
        finally:
            with self._lock:
                self.in_flight -= 1
        pieces = word_pieces(text)
        logprobs = scripted_logprobs(pieces, request.top_logprobs) if request.logprobs else None
        choice = ChatChoice(text, "stop", len(pieces), pieces, logprobs)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in request.messages)
        return ChatResult(choices=[choice] * request.n, prompt_tokens=prompt_tokens)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.embed_fn(t) for t in texts]

    def close(self) -> None:
        pass
