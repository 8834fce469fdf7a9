"""Frozen data types shared by every part of rldojo, and the shape glossary.

Everything that crosses a module boundary is one of these: a `Task` goes into an
environment, the policy's `Completion`s become a `Rollout`, a grader turns a rollout into
a `Score`. They are plain data (no behaviour beyond small constructors) so that they can
be pickled to worker processes, written to the ledger and compared in tests.

Shape glossary (used in every `# [..]` comment on tensor lines):
    B  sequences in a batch (prompts x samples)
    G  samples per task (group size)
    P  prompt length (tokens, left padded)
    T  completion length (tokens, right padded)
    L  full sequence length, P + T
    V  vocabulary size
    M  sequences in one micro-batch
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Message = dict[str, str]
"""One chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": ...}``."""

ScoreStatus = Literal["ok", "error", "timeout", "invalid"]
"""`ok`: `Score.value` is a real reward. Anything else: no reward, kept out of the gradient."""

RolloutStatus = Literal["ok", "env_error", "policy_error", "timeout", "truncated"]
"""Status of producing the rollout (before grading); only `ok` and `truncated` are trainable."""

FinishReason = Literal["stop", "length"]


def first_policy_turn(messages: Sequence[Message]) -> int:
    """Where a conversation's prompt ends: the index of its first assistant message
    (`len(messages)` when there is none), so `messages[:i]` is the prompt and
    `messages[i:]` the episode's turns."""
    return next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))


@dataclass(frozen=True)
class Task:
    """One problem an environment can pose.

    `prompt` is either a user message string or a full list of chat messages.
    `answer` is the reference answer when the task has one; `info` carries anything
    else the environment or grader needs (tests, rubric, start state, difficulty).
    """

    id: str
    prompt: str | Sequence[Message]
    answer: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    env: str = ""


@dataclass(frozen=True)
class Observation:
    """What the policy sees after `Env.reset`: the conversation so far."""

    messages: list[Message]
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """What `Env.step(action)` returns.

    `messages` are the environment's replies to append (tool results, feedback); empty
    when the episode ends. `done` ends the episode. `info` is free-form (e.g. parse
    errors counted by the trainer).
    """

    messages: list[Message]
    done: bool
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingParams:
    """How the policy samples. `seed` makes a generate call reproducible on CPU."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Completion:
    """One sampled continuation: text, its token ids, and per token the behaviour
    log-probability and the entropy of the sampling distribution (both at the sampling
    temperature; `entropies` is empty when the backend cannot report it)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    entropies: tuple[float, ...] = ()


@dataclass(frozen=True)
class Score:
    """A grader's verdict on one rollout.

    A failed grader never returns ``value=0.0``: it returns ``value=None`` with a
    non-``ok`` status, and the sample is excluded from the gradient.
    """

    value: float | None
    status: ScoreStatus = "ok"
    components: Mapping[str, float] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    token_rewards: tuple[float, ...] | None = None
    explanation: str = ""
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status == "ok" and self.value is None:
            raise ValueError("Score with status 'ok' needs a value")
        if self.status != "ok" and self.value is not None:
            raise ValueError(f"Score with status {self.status!r} must have value=None")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(
        cls,
        status: ScoreStatus,
        explanation: str,
        *,
        provenance: Mapping[str, Any] | None = None,
        flags: tuple[str, ...] = (),
    ) -> Score:
        """A grader failure: no value, the status and why."""
        return cls(
            value=None,
            status=status,
            explanation=explanation,
            provenance=dict(provenance or {}),
            flags=flags,
        )


@dataclass(frozen=True)
class Rollout:
    """One episode of the policy in an environment, ready to grade and train on.

    `messages` is the whole conversation (prompt, policy turns, environment turns).
    `completion` is the text of the final policy turn, which most graders read.
    Token-level fields cover the sequence after the prompt: `completion_ids[i]` was
    written by the policy iff `policy_mask[i]` is True, and `logprobs[i]` is its
    behaviour log-probability (0.0 on environment tokens); `entropies[i]` is the
    sampler's entropy at that token (empty when unknown).
    """

    task_id: str
    env: str
    messages: list[Message]
    completion: str
    prompt_ids: tuple[int, ...] = ()
    completion_ids: tuple[int, ...] = ()
    policy_mask: tuple[bool, ...] = ()
    logprobs: tuple[float, ...] = ()
    entropies: tuple[float, ...] = ()
    policy_version: int = 0
    status: RolloutStatus = "ok"
    sample_index: int = 0
    seed: int = 0
    error: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def trainable(self) -> bool:
        return self.status in ("ok", "truncated") and any(self.policy_mask)
