"""Multi-turn token bookkeeping: the environment's turn follows the sampled ids exactly,
even when they are not the canonical tokenisation of their text."""

from __future__ import annotations

import asyncio

import pytest

from rldojo.policy.models import load_model
from rldojo.rollout.episodes import collect_rollouts
from rldojo.types import Completion, Observation, SamplingParams, StepResult, Task

pytestmark = pytest.mark.slow  # tiny-random's tokenizer


class EchoEnv:
    env_id = "echo-v1"

    def __init__(self) -> None:
        self.turns = 0

    async def reset(self, task, *, seed):
        return Observation([{"role": "user", "content": "Spell the answer."}])

    async def step(self, action):
        self.turns += 1
        reply = [{"role": "user", "content": f"got {action!r}, again"}]
        return StepResult([] if self.turns >= 2 else reply, done=self.turns >= 2)

    async def close(self):
        pass


class SpellingPolicy:
    """Samples `Answer:42` one character per token (BPE would merge them), then the
    end-of-turn token; the second turn is cut by a stop string, with no end token."""

    version = 0

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def encode_chat(self, messages, tools=None):
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)  # fmt: skip
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, sampling):
        self.calls += 1
        tok = self.tokenizer
        chars = [tok.convert_tokens_to_ids(c) for c in "Answer:42"]
        if self.calls == 1:
            ids = (*chars, tok.convert_tokens_to_ids("<|im_end|>"))
            return [Completion("Answer:42", ids, (0.0,) * len(ids), "stop") for _ in prompts]
        ids = (*chars, *tok(" STOP more", add_special_tokens=False)["input_ids"])
        return [Completion("Answer:42", ids, (0.0,) * len(ids), "stop") for _ in prompts]


def test_env_turn_follows_non_canonical_sampled_ids():
    _, tokenizer = load_model("tiny-random")
    policy = SpellingPolicy(tokenizer)
    task = Task(id="t", prompt="", env="echo-v1")
    (rollout,) = asyncio.run(
        collect_rollouts(lambda: EchoEnv(), policy, [(task, 0, 0)], SamplingParams())
    )
    assert rollout.status == "ok"
    ids = list(rollout.completion_ids)
    mask = list(rollout.policy_mask)
    first_turn = len("Answer:42") + 1
    # the first turn's sampled ids are kept as sampled, and marked as the policy's
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in "Answer:42"]
    assert ids[:first_turn] == [*spelled, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert mask[:first_turn] == [True] * first_turn
    # the environment's tokens decode to exactly the text the template puts after the
    # assistant's content: nothing lost, nothing repeated
    env_ids = [i for i, m in zip(ids, mask, strict=True) if not m]
    expected = tokenizer.apply_chat_template(
        rollout.messages[:-1], tokenize=False, add_generation_prompt=True
    )
    opening = tokenizer.apply_chat_template(
        rollout.messages[:2], tokenize=False, add_generation_prompt=False
    )
    assert tokenizer.decode(env_ids) == "\n" + expected[len(opening) :]
    # and the whole context of the second turn is the conversation as the template renders it
    second_start = mask.index(True, first_turn)
    context = tokenizer.decode(list(rollout.prompt_ids) + ids[:second_start])
    assert context == expected
