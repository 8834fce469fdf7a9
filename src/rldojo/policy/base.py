"""The `Policy` protocol: what the rollout engine needs from an inference backend, and the
`Tokenizer` protocol: what rldojo calls on a backend's tokenizer.

A policy turns chat prompts into sampled completions with token ids and behaviour
log-probabilities, and accepts new weights from the trainer. `version` counts weight
updates so every rollout records which policy produced it (bounded staleness, ledger).
Backends: `transformers` (CPU/GPU, in process), vLLM and OpenAI-compatible HTTP (later).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

from rldojo.types import Completion, Message, SamplingParams

if TYPE_CHECKING:
    from rldojo.policy.sampling import DecodeStep


class Tokenizer(Protocol):
    """What rldojo calls on a tokenizer: a Hugging Face tokenizer as
    `rldojo.policy.models.load_tokenizer` returns it (left padding, a padding token), or a
    test's stand-in.

    Hugging Face annotates `decode` and `apply_chat_template` with every shape they can
    return; rldojo decodes one sequence and renders templates as text, so this protocol
    states those calls' returns (`models.prepare_tokenizer` is where a loaded tokenizer
    becomes a `Tokenizer`)."""

    chat_template: str | dict[str, str] | None
    """The Jinja chat template (or named templates); None when the tokenizer has none."""

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int:
        """rldojo ends every completion on it, so a tokenizer it uses has one."""
        ...

    def __call__(self, text: str, *, add_special_tokens: bool = True) -> Mapping[str, list[int]]:
        """`{"input_ids": [...], ...}` of one text."""
        ...

    def __len__(self) -> int:
        """The vocabulary size, added tokens included."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def batch_decode(
        self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False
    ) -> list[str]: ...

    def apply_chat_template(
        self,
        conversation: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
    ) -> str:
        """The conversation as text (rldojo always passes `tokenize=False`)."""
        ...

    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> object: ...


class Policy(Protocol):
    """A generation backend: chat encoding, batched sampling, weight updates.

    Optional: a backend that holds resources beyond its Python objects (vLLM's engine and
    weight snapshot) also implements `ClosablePolicy`; the run closes it at its end."""

    version: int

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer of the token ids it takes and returns; None for a backend whose ids
        are no tokenizer's (`TextPolicy`'s framed bytes, a test's scripted policy)."""
        ...

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


class StreamingPolicy(Policy, Protocol):
    """A policy whose `generate` also reports each decode step as it is sampled (the
    transformers backend): `on_step` sees the step's tokens and the rows it ended."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        on_step: Callable[[DecodeStep], None] | None = None,
    ) -> list[Completion]: ...


def streams_steps(policy: Policy) -> TypeGuard[StreamingPolicy]:
    """Whether `policy.generate` takes `on_step` (a `StreamingPolicy`)."""
    return "on_step" in inspect.signature(policy.generate).parameters


class EnginePolicy(Policy, Protocol):
    """A policy with an inference engine that takes one request at a time and batches the
    requests in flight itself, at the token level: a request joins the running decode
    batch at its next step and leaves it when it ends (the transformers backend's
    `rldojo.policy.engine`). The rollout engine runs one coroutine per episode against it.

    A request with `sampling.seed` set samples from a generator of its own, seeded with
    it: its tokens depend on no other request in flight (up to float summation order).
    Requests with equal prompts and seeds sample alike: give a group's requests seeds of
    their own."""

    async def agenerate(self, prompt: Sequence[int], sampling: SamplingParams) -> Completion:
        """One completion of one prompt, decoded with whatever else is in flight."""
        ...

    def engine_stats(self) -> dict[str, float]:
        """Counters since the engine started (each only grows): `decode_steps` (forward
        passes of one token per row), `decode_rows` (their rows summed: / `decode_steps`
        is the mean occupancy), `generated_tokens` (tokens sampled; each request's first
        comes from its prefill), `prefill_tokens` (prompt tokens prefilled in the model),
        `reused_tokens` (prompt tokens served from kept keys and values instead),
        `joins` (requests that joined a batch already decoding), `busy_s` (seconds the
        engine's thread spent in steps: the model and sampling), `max_rows` (the most
        rows in flight at once). Zeros before the first request."""
        ...


def has_engine(policy: Policy) -> TypeGuard[EnginePolicy]:
    """Whether `policy` takes requests one at a time (`EnginePolicy`)."""
    return callable(getattr(policy, "agenerate", None))


@runtime_checkable
class ClosablePolicy(Protocol):
    """A policy with something to release at the end of a run (`Policy`'s optional member)."""

    def close(self) -> None: ...


def chat_template_ids(
    tokenizer: Tokenizer, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
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


def stop_ids(tokenizer: Tokenizer) -> set[int]:
    """Token ids that end a completion in every backend: the tokenizer's eos and pad."""
    ids = {int(tokenizer.eos_token_id)}
    if tokenizer.pad_token_id is not None:
        ids.add(int(tokenizer.pad_token_id))
    return ids


def completion_text(tokenizer: Tokenizer, ids: Sequence[int], stops: Sequence[str]) -> str:
    """A completion's text in every backend: its ids decoded without special tokens, cut
    at the first stop string (the ids keep the token that completed it)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    for stop in stops:
        text = text.split(stop)[0]
    return text
