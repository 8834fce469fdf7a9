"""Recorded conversations through the rollout engine: supervised data gets the token
bookkeeping of rollouts.

`conversation_rollout(tokenizer, messages, tools)` replays a finished conversation (a
demonstration, a teacher's episode) through `rollout.episodes.collect_rollouts`: a
`ReplayEnv` answers each assistant turn with the environment messages that followed it
in the recording, and a `ScriptedPolicy` "samples" the recorded assistant turns,
tokenised as the sampler emits a turn (the content's tokens, then the end-of-turn token).
The `Rollout` that comes back holds `prompt_ids`, `completion_ids` and `policy_mask`
exactly as an RL episode with the same text would, so supervised fine-tuning trains on
the tokens RL trains on, and masks what RL masks (prompt, tool results, environment
turns, the template's text between turns).

`ScriptedPolicy` is also a `Policy` for tests and probes that need chosen text at a
chosen turn (a malformed tool call, then its correction) through the real engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rldojo.envs.base import EpisodeDone
from rldojo.graders.base import Grader
from rldojo.policy.base import Tokenizer, chat_template_ids
from rldojo.rollout.episodes import collect_rollouts
from rldojo.types import Completion, Message, Observation, Rollout, SamplingParams, StepResult, Task

__all__ = ["ReplayEnv", "ScriptedPolicy", "conversation_rollout", "split_conversation"]


def split_conversation(
    messages: Sequence[Message],
) -> tuple[list[Message], list[tuple[str, list[Message]]]]:
    """`(opening, turns)`: the messages before the first assistant turn, and for each
    assistant turn its text and the non-assistant messages that follow it."""
    opening: list[Message] = []
    turns: list[tuple[str, list[Message]]] = []
    for message in messages:
        if message.get("role") == "assistant":
            turns.append((str(message.get("content") or ""), []))
        elif turns:
            turns[-1][1].append({"role": message["role"], "content": message["content"]})
        else:
            opening.append({"role": message["role"], "content": message["content"]})
    return opening, turns


class ScriptedPolicy:
    """A `Policy` whose turns are given text: turn k of the (one) episode is `turns[k]`.

    A turn's token ids are the tokenizer's ids of its text followed by the end-of-turn
    (EOS) token, as the sampler returns a turn that ends; log-probs are 0. `generate`
    serves one episode at a time (one prompt per call)."""

    def __init__(self, tokenizer: Tokenizer, turns: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.version = 0
        self._next = 0
        self._eos = int(tokenizer.eos_token_id)

    def encode_chat(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        return chat_template_ids(self.tokenizer, messages, tools)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        if len(prompts) != 1:
            raise ValueError(f"ScriptedPolicy serves one episode; got {len(prompts)} prompts")
        if self._next >= len(self.turns):
            raise RuntimeError(f"ScriptedPolicy: no turn {self._next + 1} scripted")
        text = self.turns[self._next]
        self._next += 1
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self._eos]
        return [Completion(text, tuple(ids), (0.0,) * len(ids), "stop")]

    def update_weights(self, state_dict: dict[str, Any] | None = None) -> None:
        self.version += 1


class ReplayEnv:
    """An environment that answers assistant turn k with the recorded messages after it,
    and ends after the last recorded assistant turn."""

    env_id = "replay"

    def __init__(
        self,
        opening: Sequence[Message],
        replies: Sequence[Sequence[Message]],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        self.opening, self.replies = list(opening), [list(r) for r in replies]
        self.tools = list(tools) if tools else None
        self._turn = 0

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return []

    async def reset(self, task: Task, *, seed: int) -> Observation:
        self._turn = 0
        info = {"tools": self.tools} if self.tools else {}
        return Observation(messages=[dict(m) for m in self.opening], info=info)

    async def step(self, action: str) -> StepResult:
        if self._turn >= len(self.replies):
            raise EpisodeDone("replay: step() after the last recorded turn")
        reply = self.replies[self._turn]
        self._turn += 1
        done = self._turn == len(self.replies)
        return StepResult(messages=[] if done else [dict(m) for m in reply], done=done)

    async def close(self) -> None:
        return None

    def default_grader(self) -> Grader:
        raise NotImplementedError("a replayed conversation is not graded")


def conversation_rollout(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    task_id: str = "demo",
    env: str = "replay",
) -> Rollout:
    """The `Rollout` the engine records for this conversation (see the module docstring).

    Raises `ValueError` when the conversation has no assistant turn, and whatever the
    engine recorded as the failure when the replay could not finish (e.g. a chat template
    that rejects the message order)."""
    opening, turns = split_conversation(messages)
    if not turns:
        raise ValueError("the conversation has no assistant turn")
    if not opening:
        raise ValueError("the conversation starts with an assistant turn (no prompt)")
    policy = ScriptedPolicy(tokenizer, [text for text, _ in turns])
    replay = ReplayEnv(opening, [reply for _, reply in turns], tools)
    task = Task(id=task_id, prompt=opening, env=env)
    (rollout,) = asyncio.run(
        collect_rollouts(
            lambda: replay,
            policy,
            [(task, 0, 0)],
            SamplingParams(max_new_tokens=1),
            max_turns=len(turns),
        )
    )
    if rollout.status != "ok":
        raise ValueError(f"replay failed ({rollout.status}): {rollout.error}")
    return rollout
