"""Streaming a reply as it is sampled: each new token's text, released once it is final.

A token's text is not always final when it is sampled:

- a character split over several tokens decodes only once its last token is in (the
  earlier ones release "");
- text that may be the start of a stop string is held back until the string is ruled
  out (the stop string and what follows it are never sent, as in the whole reply);
- text from a marker on (``<tool_call>`` when the request offers tools) is held back
  too, to be sent parsed, as OpenAI `tool_calls` (`rldojo.inference.chat_tools`).

So what a stream has sent is always a prefix of the whole reply's text, and its pieces
join to it. `ChoiceStreams` turns the sampler's decode steps (`rldojo.policy.sampling.
DecodeStep`) into `TokenEvent`s for one request's choices, on the sampling thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rldojo.inference.logprobs import TokenLogprob, token_entries
from rldojo.inference.protocol import TokenEvent
from rldojo.policy.base import Tokenizer, completion_text
from rldojo.policy.sampling import DecodeStep, StepHook

if TYPE_CHECKING:
    import torch

__all__ = ["ChoiceStreams", "Put", "TextStream", "releasable", "stream_hook", "when_all_done"]


def releasable(text: str, holds: Sequence[str]) -> int:
    """How much of `text` may be sent: everything before the first of `holds` (stop
    strings, markers), and not a tail that could still grow into one of them."""
    end = len(text)
    for hold in holds:
        if not hold:
            continue
        found = text.find(hold)
        if found >= 0:
            end = min(end, found)
        for k in range(min(len(hold) - 1, len(text)), 0, -1):
            if text.endswith(hold[:k]):
                end = min(end, len(text) - k)
                break
    return end


class TextStream:
    """One choice's text as its tokens arrive (incremental detokenization over a short
    window of earlier tokens, as `rldojo.inference.logprobs.token_pieces` reads a whole
    reply, so the pieces agree with it); `add` returns the text that became final."""

    def __init__(self, tokenizer: Tokenizer, holds: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.holds = tuple(holds)
        self.ids: list[int] = []
        self.text = ""
        """Decoded so far (special tokens skipped)."""
        self.sent = 0
        """Characters of `text` released so far."""
        self._start = self._read = 0  # window start; first token not yet turned into text

    def add(self, token: int) -> str:
        self.ids.append(token)
        decode = self.tokenizer.decode
        before = decode(self.ids[self._start : self._read], skip_special_tokens=True)
        after = decode(self.ids[self._start :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._start, self._read = self._read, len(self.ids)
        return self._release(releasable(self.text, self.holds))

    def finish(self, final: str) -> str:
        """The rest of the reply once it has ended (`final`: its whole text)."""
        if not final.startswith(self.text[: self.sent]):  # a decode that is not prefix-stable
            return ""
        self.text = final
        return self._release(len(final))

    def _release(self, upto: int) -> str:
        piece = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return piece


class ChoiceStreams:
    """The choices of one request being streamed: decode steps in, `TokenEvent`s out.

    Args:
        tokenizer: the model's tokenizer.
        n: choices of this request; `first_index`: the index of the first one.
        stops: the request's stop strings (held back, then cut).
        top_logprobs: alternatives per token when the request asked for logprobs, else None.
        emit: called with each event, on the sampling thread (it must be thread-safe).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        n: int,
        first_index: int,
        stops: tuple[str, ...],
        top_logprobs: int | None,
        emit: Callable[[TokenEvent], None],
    ) -> None:
        self.tokenizer = tokenizer
        self.first_index = first_index
        self.stops = stops
        self.top_logprobs = top_logprobs
        self.emit = emit
        self.texts = [TextStream(tokenizer, stops) for _ in range(n)]
        self.ended = [False] * n

    def on_tokens(
        self,
        choices: list[int],
        tokens: list[int],
        logits: torch.Tensor,
        finished: Sequence[str | None],
    ) -> None:
        """One decode step of some of the choices: `choices[i]` sampled `tokens[i]` from
        `logits[i]` ([k, V]), and ended with `finished[i]` (None: goes on)."""
        pieces = []
        for choice, token, reason in zip(choices, tokens, finished, strict=True):
            text = self.texts[choice]
            piece = text.add(token)
            if reason is not None:
                piece += text.finish(completion_text(self.tokenizer, text.ids, self.stops))
                self.ended[choice] = True
            pieces.append(piece)
        entries: Sequence[TokenLogprob | None] = [None] * len(tokens)
        if self.top_logprobs is not None:
            entries = token_entries(self.tokenizer, logits, tokens, pieces, self.top_logprobs)
        for choice, piece, entry, reason in zip(choices, pieces, entries, finished, strict=True):
            self.emit(TokenEvent(self.first_index + choice, piece, entry, reason))

    def close(self) -> None:
        """End the choices that sampled no token (`max_tokens` 0)."""
        for choice, ended in enumerate(self.ended):
            if not ended:
                self.emit(TokenEvent(self.first_index + choice, None, None, "length"))
                self.ended[choice] = True


Put = Callable[[TokenEvent | BaseException | None], None]
"""Hands a stream's next item to the event loop reading it (None: the stream is over)."""


def stream_hook(owners: list[tuple[ChoiceStreams | None, int]]) -> StepHook:
    """The sampler's per-step callback for a batch: each streamed request's rows, as its
    choices, go to its `ChoiceStreams` (`owners[row]`: the streams, or None for a request
    not streamed, and the choice of that row)."""

    def hook(step: DecodeStep) -> None:
        mine: dict[int, tuple[ChoiceStreams, list[int], list[int]]] = {}
        for pos, row in enumerate(step.rows):
            streams, choice = owners[row]
            if streams is not None:
                _, positions, choices = mine.setdefault(id(streams), (streams, [], []))
                positions.append(pos)
                choices.append(choice)
        for streams, positions, choices in mine.values():
            tokens = [step.tokens[p] for p in positions]
            finished = [step.finished[p] for p in positions]
            streams.on_tokens(choices, tokens, step.logits[positions], finished)

    return hook


def when_all_done(futures: list[concurrent.futures.Future[Any]], put: Put) -> None:
    """`put` the first failure (if any), then None, once every future is done."""
    state = {"left": len(futures), "failed": False}
    lock = threading.Lock()

    def done(future: concurrent.futures.Future[Any]) -> None:
        error = future.exception()
        with lock:
            state["left"] -= 1
            report = error is not None and not state["failed"]
            state["failed"] = state["failed"] or error is not None
            last = state["left"] == 0
        if report:
            put(error)
        if last:
            put(None)

    for future in futures:
        future.add_done_callback(done)
