"""The `Policy` protocol: what the rollout engine needs from an inference backend.

A policy turns chat prompts into sampled completions with token ids and behaviour
log-probabilities, and accepts new weights from the trainer. `version` counts weight
updates so every rollout records which policy produced it (bounded staleness, ledger).
Backends: `transformers` (CPU/GPU, in process), vLLM and OpenAI-compatible HTTP (later).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rldojo.types import Completion, Message, SamplingParams


class Policy(Protocol):
    """A generation backend: chat encoding, batched sampling, weight updates."""

    version: int
    tokenizer: Any

    def encode_chat(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a conversation, ending with the assistant turn's opening; `tools`
        (OpenAI-format schemas) go through the chat template where it supports them."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """One completion per prompt (repeat a prompt G times for a group)."""
        ...

    def update_weights(self, state_dict: dict[str, Any] | None = None) -> None:
        """Load trained weights: `state_dict`, or by default the trained model the backend
        was built on (the trainer's own sampler); increments `version`."""
        ...


def chat_template_ids(
    tokenizer: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
) -> list[int]:
    """`Policy.encode_chat` for a backend with a Hugging Face tokenizer: the chat template
    with the assistant turn opened, tokenized without extra special tokens. Every such
    backend uses this one function, so the trainer, the native sampler and vLLM see the
    same token ids for a conversation."""
    kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True, **kwargs
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a completion in every backend: the tokenizer's eos and pad."""
    ids = {int(tokenizer.eos_token_id)}
    if tokenizer.pad_token_id is not None:
        ids.add(int(tokenizer.pad_token_id))
    return ids


def completion_text(tokenizer: Any, ids: Sequence[int], stops: Sequence[str]) -> str:
    """A completion's text in every backend: its ids decoded without special tokens, cut
    at the first stop string (the ids keep the token that completed it)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    for stop in stops:
        text = text.split(stop)[0]
    return str(text)
