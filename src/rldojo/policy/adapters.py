"""Text-level policies: chat functions and HTTP endpoints as token-level `Policy`s.

`TextPolicy` adapts a function that answers conversations with text to the token-level
`rldojo.policy.base.Policy` protocol through a byte codec, so the same rollout engine
(multi-turn included) that drives a local model also drives `OpenAIPolicy` (any
OpenAI-compatible endpoint, e.g. `rldojo serve` or vLLM) and `callable_policy(fn)`
(baselines, oracles, tests). They carry no log-probs and no weights: evaluation only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rldojo.policy.base import Tokenizer
from rldojo.types import Completion, Message, SamplingParams

_MSG, _ROLE_END, _MSG_END = 256, 257, 258
"""Byte codec markers: ids 0..255 are UTF-8 bytes, these three frame the messages."""


def _encode_message(role: str, content: str | None) -> list[int]:
    ids = [_MSG, *role.encode(), _ROLE_END]
    return ids if content is None else [*ids, *content.encode(), _MSG_END]


def decode_chat(ids: Sequence[int]) -> list[Message]:
    """Inverse of `TextPolicy.encode_chat`, dropping the trailing open assistant turn."""
    messages: list[Message] = []
    role, buf = "", bytearray()
    for tok in ids:
        if tok == _MSG:
            role, buf = "", bytearray()
        elif tok == _ROLE_END:
            role, buf = buf.decode(), bytearray()
        elif tok == _MSG_END:
            messages.append({"role": role, "content": buf.decode(errors="replace")})
            buf = bytearray()
        else:
            buf.append(tok)
    return messages


ChatFunction = Callable[[list[list[Message]], SamplingParams], list[str]]
"""Answers a batch of conversations: one assistant text per conversation."""


class TextPolicy:
    """A text-level chat function as a token-level `Policy`, for evaluation only.

    Conversations are encoded as framed UTF-8 bytes, so an encoded conversation is a
    prefix of the encoding of its continuation — exactly what the rollout engine needs to
    splice environment turns between policy turns. Completions carry no log-probs.
    """

    tokenizer: Tokenizer | None = None

    def __init__(self, complete: ChatFunction) -> None:
        self.version = 0
        self._complete = complete

    def encode_chat(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        # `tools` is accepted for the `Policy` contract; a text function sees none of them.
        ids = [tok for m in messages for tok in _encode_message(m["role"], m["content"])]
        return ids + _encode_message("assistant", None)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        texts = self._complete([decode_chat(p) for p in prompts], sampling)
        out = []
        for text in texts:
            ids = (*text.encode(), _MSG_END)
            out.append(Completion(text, ids, (0.0,) * len(ids), "stop"))
        return out

    def update_weights(self, state_dict: dict[str, Any] | None = None) -> None:
        raise NotImplementedError("a TextPolicy has no weights to update")


def callable_policy(fn: Callable[[list[Message]], str]) -> TextPolicy:
    """A policy that answers each conversation with `fn(messages)` (baselines, oracles)."""
    return TextPolicy(lambda batch, _sampling: [fn(messages) for messages in batch])


class OpenAIPolicy(TextPolicy):
    """Samples from an OpenAI-compatible chat endpoint (`rldojo serve`, vLLM, a provider).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        api_key: sent as the bearer token (local servers accept any string).
        concurrency: requests in flight at once.
        timeout_s: per-request timeout; the SDK retries `max_retries` times.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        from openai import OpenAI

        super().__init__(self._complete_batch)
        self.model = model
        self.concurrency = concurrency
        self._client = OpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
        )

    def _one(self, messages: list[Message], sampling: SamplingParams, index: int) -> str:
        response = self._client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=sampling.max_new_tokens,
            temperature=max(sampling.temperature, 0.0),
            top_p=sampling.top_p,
            stop=list(sampling.stop) or None,
            seed=None if sampling.seed is None else sampling.seed + index,
        )
        return response.choices[0].message.content or ""

    def _complete_batch(self, batch: list[list[Message]], sampling: SamplingParams) -> list[str]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self._one, batch, [sampling] * len(batch), range(len(batch))))
