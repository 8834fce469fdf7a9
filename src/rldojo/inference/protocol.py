"""What flows between the HTTP layer of `rldojo serve` and an engine: the `ChatEngine`
protocol, the requests it answers and the results it returns.

The HTTP layer (`rldojo.inference.app`) validates JSON into these requests and writes the
results out as OpenAI JSON; the engines (`rldojo.inference.engine.TransformersEngine`, a
local model, and `rldojo.inference.scripted.ScriptedEngine`, a scripted stand-in) never
see JSON. Three ways to answer:

- `chat` / `complete`: the whole reply at once (`ChatResult` / `CompletionResult`);
- `stream`: a `ChatStream` whose `TokenEvent`s arrive as the tokens are sampled.

A request the engine cannot serve (a token id outside the vocabulary, a prompt longer
than the model's context) raises `RequestError`, which the HTTP layer turns into a 400
naming the field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rldojo.inference.logprobs import TokenLogprob
from rldojo.types import Message

__all__ = [
    "ChatChoice",
    "ChatEngine",
    "ChatRequest",
    "ChatResult",
    "ChatStream",
    "CompletionRequest",
    "CompletionResult",
    "PromptEcho",
    "RequestError",
    "TokenEvent",
    "stop_strings",
]


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """A request's `stop` (one string, a list, or none) as the non-empty stop strings."""
    listed = stop if isinstance(stop, list) else [stop] if stop else []
    return tuple(s for s in listed if s)


class RequestError(ValueError):
    """A request the engine cannot serve; `param` names the request field at fault, `code`
    is OpenAI's error code (`context_length_exceeded`, `empty_array`, `invalid_value`)."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


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
    tools: tuple[dict[str, Any], ...] = ()
    """OpenAI function schemas the model may call (`rldojo.inference.chat_tools` renders
    them into the prompt); empty: no tools, or `tool_choice: "none"`."""
    max_tokens_field: str = "max_tokens"
    """The request field `max_tokens` came from (or `max_completion_tokens`), which a
    length error names."""
    max_tokens_default: bool = False
    """The client named no limit: `max_tokens` is the server's default, which an engine
    shortens to what its context window leaves after the prompt."""


@dataclass(frozen=True)
class CompletionRequest:
    """One legacy completion request (/v1/completions): raw prompts, no chat template."""

    prompts: list[str | list[int]]
    """Each prompt as text or as token ids; every prompt gets `n` choices."""
    max_tokens: int = 16
    """0 (with `echo`): no generation, only the prompt is scored."""
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    """Alternatives per token to report (0..20); None: no logprobs at all."""
    echo: bool = False
    """Return the prompt before the completion (and, with `logprobs`, its tokens' scores)."""


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


@dataclass(frozen=True)
class PromptEcho:
    """A prompt as `echo` returns it: its text, the text of each of its tokens, and (with
    logprobs) each token's score given the tokens before it; the first token has none."""

    text: str
    pieces: tuple[str, ...]
    logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True)
class CompletionResult:
    choices: list[ChatChoice]
    """Prompt-major: prompt i's `n` choices are `choices[i * n : (i + 1) * n]`."""
    echoes: list[PromptEcho]
    """One per prompt with `echo`; empty without."""
    prompt_tokens: int
    """Tokens of all prompts together (each counted once, whatever `n`)."""


@dataclass(frozen=True)
class TokenEvent:
    """One streamed step of one choice."""

    index: int
    """The choice (prompt-major over prompts, like `CompletionResult.choices`)."""
    piece: str | None
    """The text this token adds (may be "": held back, or no text); None: no token, the
    choice only ends here (an empty reply)."""
    logprob: TokenLogprob | None = None
    """The token's logprob entry, when the request asked for logprobs."""
    finish_reason: str | None = None
    """Set on the choice's last event."""


@dataclass
class ChatStream:
    """A reply being generated: its events arrive as they are sampled. Iterating raises
    the engine's error if generation fails midway."""

    prompt_tokens: int
    events: AsyncIterator[TokenEvent]
    choices: int
    """How many choices the events are spread over."""
    echoes: list[PromptEcho]

    @staticmethod
    def replay(result: ChatResult, echoes: Sequence[PromptEcho] = ()) -> ChatStream:
        """A finished result as a stream, token by token, choices interleaved (an engine
        that cannot stream, e.g. `ScriptedEngine`, answers `stream` with this)."""

        async def events() -> AsyncIterator[TokenEvent]:
            lanes = [_choice_events(i, c) for i, c in enumerate(result.choices)]
            for step in range(max((len(lane) for lane in lanes), default=0)):
                for lane in lanes:
                    if step < len(lane):
                        yield lane[step]

        return ChatStream(result.prompt_tokens, events(), len(result.choices), list(echoes))


def _choice_events(index: int, choice: ChatChoice) -> list[TokenEvent]:
    """A finished choice's events: one per token (the last says why it ended)."""
    pieces = choice.pieces or ((choice.text,) if choice.text else ())
    if not pieces:
        return [TokenEvent(index, None, None, choice.finish_reason)]
    logprobs = choice.logprobs or ()
    return [
        TokenEvent(
            index,
            piece,
            logprobs[pos] if pos < len(logprobs) else None,
            choice.finish_reason if pos == len(pieces) - 1 else None,
        )
        for pos, piece in enumerate(pieces)
    ]


class ChatEngine(Protocol):
    """What the server needs from a model."""

    model: str

    async def chat(self, request: ChatRequest) -> ChatResult: ...

    async def complete(self, request: CompletionRequest) -> CompletionResult: ...

    async def stream(self, request: ChatRequest | CompletionRequest) -> ChatStream:
        """Start generating; the returned stream's events come as tokens are sampled."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def close(self) -> None: ...
