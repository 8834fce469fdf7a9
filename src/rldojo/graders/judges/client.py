"""Judge backends: how a grader asks a stronger model for a verdict.

    backend = OpenAIJudge("http://127.0.0.1:8000/v1", "smollm2-135m-instruct")
    judge = JudgeClient(backend, JudgeCache("judge.sqlite"))
    reply = await judge.complete(JudgeRequest(messages), template_hash="…")

Backends (`JudgeBackend`):
    `OpenAIJudge`   any OpenAI-compatible chat endpoint through the openai SDK (vLLM's and
                    llama.cpp's servers, `rldojo serve`, hosted APIs): a concurrency limit,
                    retries with exponential backoff on transport errors (connection,
                    timeout, 429, 5xx), a per-call timeout. 4xx errors are not retried.
    `EngineJudge`   a `rldojo.inference` engine called in-process: `TransformersEngine` (a
                    local transformers model, batched) or `ScriptedEngine` (tests).

`JudgeClient` is what graders hold: the backend plus the persistent cache
(`rldojo.graders.judges.cache`), counters (`JudgeStats`: backend calls, cache hits,
failures) and the provenance every judged `Score` carries (judge model, template hash,
sampling parameters, seed). Identical requests in flight at the same time share one call.

A backend that cannot answer raises `JudgeError` (or `JudgeTimeout`); graders turn that
into `Score.failed("error" | "timeout")`, never a reward of 0.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from rldojo.graders.judges.cache import JudgeCache, cache_key
from rldojo.graders.judges.injection import VerdictError
from rldojo.types import Message, Score, ScoreStatus

if TYPE_CHECKING:
    from rldojo.inference.protocol import ChatEngine

__all__ = [
    "EngineJudge",
    "JudgeBackend",
    "JudgeClient",
    "JudgeError",
    "JudgeReply",
    "JudgeRequest",
    "JudgeStats",
    "JudgeTimeout",
    "OpenAIJudge",
    "Verdict",
    "ask_verdict",
    "judge_failure",
]

T = TypeVar("T")


class JudgeError(RuntimeError):
    """The judge could not be asked (transport or HTTP error after retries)."""


class JudgeTimeout(JudgeError):
    """Every attempt ran past the per-call timeout."""


@dataclass(frozen=True)
class JudgeRequest:
    """One judge call. Defaults are a deterministic judge: greedy, seed 0."""

    messages: list[Message]
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Extra request fields (e.g. ``response_format``, ``reasoning_effort``)."""

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            **dict(self.extra),
        }

    def payload(self) -> dict[str, Any]:
        """Everything that determines the reply (the cache key input)."""
        return {"messages": self.messages, "seed": self.seed, **self.sampling()}

    def followed_by(self, reply: str, message: str) -> JudgeRequest:
        """This conversation plus the judge's reply and a new user message (repair turn)."""
        messages = [
            *self.messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": message},
        ]
        return JudgeRequest(
            messages, self.temperature, self.top_p, self.max_tokens, self.seed, self.extra
        )


class JudgeBackend(Protocol):
    """Answers a judge request with the reply text, or raises `JudgeError`."""

    model: str
    kind: str

    async def complete(self, request: JudgeRequest) -> str: ...

    async def aclose(self) -> None: ...


# ------------------------------------------------------------------------------ OpenAI


class OpenAIJudge:
    """An OpenAI-compatible chat endpoint through the openai SDK.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the endpoint serves.
        api_key: sent as a bearer token (local servers ignore it).
        timeout_s: per-call timeout.
        max_retries: extra attempts after a transport error (connection, timeout, 429, 5xx).
        backoff_s: first retry delay; doubles per attempt (capped at 8 s), with jitter.
        concurrency: most calls in flight at once (per event loop).
    """

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        concurrency: int = 8,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        # asyncio primitives and httpx clients belong to one event loop each.
        self._per_loop: weakref.WeakKeyDictionary[Any, tuple[Any, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )

    def _state(self) -> tuple[Any, asyncio.Semaphore]:
        import openai

        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=self.timeout_s,
                max_retries=0,  # retries are ours: counted, with our backoff
            )
            state = (client, asyncio.Semaphore(self.concurrency))
            self._per_loop[loop] = state
        return state

    async def complete(self, request: JudgeRequest) -> str:
        import openai

        client, gate = self._state()
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(8.0, self.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
            try:
                async with gate:
                    response = await client.chat.completions.create(
                        model=self.model,
                        messages=request.messages,
                        temperature=request.temperature,
                        top_p=request.top_p,
                        max_tokens=request.max_tokens,
                        seed=request.seed,
                        extra_body=dict(request.extra) or None,
                    )
                return response.choices[0].message.content or ""
            except (openai.APIConnectionError, openai.RateLimitError) as exc:
                last = exc  # includes APITimeoutError: transport, retried
            except openai.APIStatusError as exc:
                if exc.status_code < 500:
                    raise JudgeError(f"judge endpoint refused the request: {exc}") from exc
                last = exc
        if isinstance(last, openai.APITimeoutError):
            raise JudgeTimeout(
                f"judge call timed out after {self.max_retries + 1} attempts of "
                f"{self.timeout_s:g}s ({self.base_url})"
            )
        raise JudgeError(
            f"judge call failed after {self.max_retries + 1} attempts ({self.base_url}): "
            f"{type(last).__name__}: {last}"
        )

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        state = self._per_loop.pop(loop, None)
        if state is not None:
            await state[0].close()


# ------------------------------------------------------------------------------ in-process


class EngineJudge:
    """A `rldojo.inference` engine (`TransformersEngine`, `ScriptedEngine`) called in-process."""

    kind = "in-process"

    def __init__(self, engine: ChatEngine, *, owns_engine: bool = True) -> None:
        self.engine = engine
        self.model = str(engine.model)
        self._owns = owns_engine

    async def complete(self, request: JudgeRequest) -> str:
        from rldojo.inference.engine import ChatRequest

        try:
            result = await self.engine.chat(
                ChatRequest(
                    messages=request.messages,
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                    top_p=request.top_p,
                    seed=request.seed,
                    model=self.model,
                )
            )
        except Exception as exc:
            raise JudgeError(f"in-process judge failed: {type(exc).__name__}: {exc}") from exc
        return result.choices[0].text

    async def aclose(self) -> None:
        if self._owns:
            self.engine.close()


# ------------------------------------------------------------------------------ client


@dataclass
class JudgeStats:
    """What a judge client did: backend calls made, cache hits, failed calls."""

    calls: int = 0
    cache_hits: int = 0
    failures: int = 0

    @property
    def requests(self) -> int:
        return self.calls + self.cache_hits

    @property
    def hit_rate(self) -> float:
        return self.cache_hits / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class JudgeReply:
    text: str
    cached: bool


class JudgeClient:
    """A backend plus the persistent cache, counters and provenance (see module docstring)."""

    def __init__(self, backend: JudgeBackend, cache: JudgeCache | None = None) -> None:
        self.backend = backend
        self.cache = cache
        self.stats = JudgeStats()
        self._inflight: dict[tuple[int, str], asyncio.Future[str]] = {}

    @property
    def model(self) -> str:
        return self.backend.model

    async def complete(self, request: JudgeRequest, *, template_hash: str) -> JudgeReply:
        """The reply to `request`: from the cache, from a call already in flight, or new."""
        key = cache_key(self.backend.model, template_hash, request.payload())
        if self.cache is not None and (text := self.cache.get(key)) is not None:
            self.stats.cache_hits += 1
            return JudgeReply(text, cached=True)
        flight = (id(asyncio.get_running_loop()), key)
        if (pending := self._inflight.get(flight)) is not None:
            self.stats.cache_hits += 1
            return JudgeReply(await asyncio.shield(pending), cached=True)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._inflight[flight] = future
        try:
            self.stats.calls += 1
            text = await self.backend.complete(request)
        except BaseException as exc:
            self.stats.failures += 1
            shared = exc
            if isinstance(exc, asyncio.CancelledError):  # a waiter is not itself cancelled
                shared = JudgeError("the shared judge call was cancelled")
            future.set_exception(shared)
            future.exception()  # retrieved: no "never retrieved" warning when unshared
            raise
        finally:
            self._inflight.pop(flight, None)
        future.set_result(text)
        if self.cache is not None:
            meta = {"backend": self.backend.kind, "seed": request.seed}
            self.cache.put(
                key, text, model=self.backend.model, template_hash=template_hash, meta=meta
            )
        return JudgeReply(text, cached=False)

    def provenance(self, request: JudgeRequest, template_hash: str) -> dict[str, Any]:
        """What every judged Score records about how it was judged."""
        out: dict[str, Any] = {
            "judge_model": self.backend.model,
            "judge_backend": self.backend.kind,
            "template_hash": template_hash,
            "sampling": request.sampling(),
            "seed": request.seed,
        }
        if base_url := getattr(self.backend, "base_url", None):
            out["judge_url"] = base_url
        return out

    async def aclose(self) -> None:
        await self.backend.aclose()


# ------------------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class Verdict(Generic[T]):
    """A parsed judge verdict (`value`), or why there is none (`error`)."""

    value: T | None
    error: str
    attempts: int
    cached: bool
    """Every call behind this verdict was answered from the cache."""
    replies: tuple[str, ...]


async def ask_verdict(
    judge: JudgeClient,
    request: JudgeRequest,
    template_hash: str,
    parse: Callable[[str], T],
    repair: Callable[[str], str],
) -> Verdict[T]:
    """Ask, parse; on a `VerdictError` ask once more with `repair(error)`, then give up.

    Transport failures raise `JudgeError` / `JudgeTimeout` (see `judge_failure`).
    """
    first = await judge.complete(request, template_hash=template_hash)
    try:
        return Verdict(parse(first.text), "", 1, first.cached, (first.text,))
    except VerdictError as exc:
        error = str(exc)
    retry = request.followed_by(first.text, repair(error))
    second = await judge.complete(retry, template_hash=template_hash)
    cached = first.cached and second.cached
    replies = (first.text, second.text)
    try:
        return Verdict(parse(second.text), "", 2, cached, replies)
    except VerdictError as exc:
        return Verdict(None, f"{error}; after one repair turn: {exc}", 2, cached, replies)


def judge_failure(
    exc: Exception, provenance: Mapping[str, Any], flags: tuple[str, ...] = ()
) -> Score:
    """The Score of a judge that could not be asked: `timeout` or `error`, never 0."""
    status: ScoreStatus = "timeout" if isinstance(exc, JudgeTimeout) else "error"
    return Score.failed(status, str(exc), provenance=provenance, flags=flags)
