"""Templates of the tool scaffold: total a shopping bill from prices only a tool knows."""

DESCRIPTION = "A multi-turn rldojo tool environment: total a bill with a price tool"

ENV = '''\
"""$name-v1: total a shopping bill; the prices are known only to a tool (multi-turn).

A tool environment (`rldojo.envs.multiturn.ToolEnv`). In each turn the policy may call
tools with <tool_call>{"name": "price", "arguments": {"item": "pencil"}}</tool_call>;
the environment runs them and replies with one <tool_response> message per call. A
reply with <answer>...</answer> ends the episode, and so do the limits (`EpisodeLimits`).

The grader's source of truth: the environment parses the final answer and counts tool
calls and protocol errors, and hands them over in `rollout.info` ("answer",
"tool/calls", "format/protocol_errors", ...). The correct total is `task.answer`; the
hidden prices are in `task.info`. Check it from the project directory:

    rldojo check-env $name.env:${camel}Env --show
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from rldojo.envs.multiturn import EpisodeLimits, ToolEnv
from rldojo.envs.tools import Tool, ToolError
from rldojo.types import Task

from $name.grader import ${camel}Grader

ENV_ID = "$name-v1"
SPLITS = ("train", "test")
DEFAULT_N = 1000
"""Tasks in a split when `tasks` is called without `n`."""
ITEMS = ("pencil", "notebook", "eraser", "ruler", "marker", "stapler")


class ${camel}Env(ToolEnv):
    """Total a bill of `items` different items; look each price up with the `price` tool.

    Args:
        items: how many different items are on a bill (1 to 6).
        limits: per-episode limits, a table merged over `default_limits` (6 turns).
        schema_style, max_calls_per_turn, ...: see `rldojo.envs.multiturn.ToolEnv`.
    """

    env_id = ENV_ID
    default_limits = EpisodeLimits(max_turns=6)
    instructions = (
        "You are a shop assistant. Look up the price of each item with the price tool, "
        "then give the total in cents as a whole number in <answer>...</answer>."
    )

    def __init__(
        self,
        items: int = 2,
        *,
        limits: EpisodeLimits | Mapping[str, Any] | None = None,
        **tool_env_kwargs: Any,
    ) -> None:
        if not 1 <= items <= len(ITEMS):
            raise ValueError(f"{ENV_ID}: items must be 1 to {len(ITEMS)}, got {items}")
        # The keyword arguments are stored (init_kwargs) so that fork() can rebuild us.
        super().__init__(limits=limits, items=items, **tool_env_kwargs)
        self.items = items

    def build_tools(self) -> list[Tool]:
        def price(item: str) -> int:
            """The price of one item, in cents.

            Args:
                item: the item's name, e.g. "pencil".
            """
            task = self.episode.task
            if task is None:
                raise ToolError("no episode is running")
            prices = task.info["prices"]
            if item not in prices:
                raise ToolError(f"unknown item {item!r}; the shop sells: {', '.join(prices)}")
            return int(prices[item])

        return [Tool.from_function(price)]

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        count = DEFAULT_N if n is None else n
        return [self.make_task(split, seed, i) for i in range(count)]

    def make_task(self, split: str, seed: int, i: int) -> Task:
        """Task `i` of a split. Its own random generator makes it the same on every call."""
        rng = random.Random(f"{ENV_ID}:{split}:{seed}:{i}")
        prices = {item: rng.randint(5, 500) for item in ITEMS}
        bill = {item: rng.randint(1, 5) for item in rng.sample(ITEMS, self.items)}
        total = sum(prices[item] * count for item, count in bill.items())
        lines = " and ".join(f"{count} x {item}" for item, count in bill.items())
        return Task(
            id=f"{ENV_ID}/{split}/{seed}/{i}",
            prompt=f"A customer buys {lines}. What is the total price in cents?",
            answer=str(total),
            info={"prices": prices, "bill": bill},
            env=ENV_ID,
        )

    def default_grader(self) -> ${camel}Grader:
        return ${camel}Grader()
'''

GRADER = '''\
"""The grader of $name-v1: the final answer from `rollout.info` against the task's total.

A grader follows `rldojo.graders.base.Grader`: a `name` and an async `grade(rollout,
task)` that returns a `Score`. In a tool environment the final answer is not re-parsed
from the conversation: the environment put it in ``rollout.info["answer"]``, with the
tool and protocol counters that `protocol_terms` turns into format penalties.

    reward = correct - format_penalty * (no final answer)
                     - error_penalty * min(protocol errors, 5)

When the grader cannot judge a rollout (here: the task has no usable total) it returns
`Score.failed(...)`, never 0.0, so the trainer keeps that sample out of the gradient.
"""

from __future__ import annotations

import re

from rldojo.envs.multiturn import protocol_terms
from rldojo.types import Rollout, Score, Task


def as_integer(text: object) -> int | None:
    """A whole number written as text ("1,250" and "1250." count); None otherwise."""
    if not isinstance(text, str):
        return None
    cleaned = re.sub(r"[\\s,_]", "", text).rstrip(".")
    return int(cleaned) if re.fullmatch(r"[+-]?\\d{1,30}", cleaned) else None


class ${camel}Grader:
    """Scores a finished episode from `rollout.info` (answer and tool counters)."""

    name = "$name"

    def __init__(self, format_penalty: float = 0.2, error_penalty: float = 0.05) -> None:
        self.format_penalty = format_penalty
        self.error_penalty = error_penalty

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        total = as_integer(task.answer)
        if total is None:
            return Score.failed("invalid", f"task {task.id} has no whole-number answer")
        answer = rollout.info.get("answer")
        correct = float(as_integer(answer) == total)
        components, penalty = protocol_terms(
            rollout.info, format_penalty=self.format_penalty, error_penalty=self.error_penalty
        )
        return Score(
            correct - penalty,
            components={"correct": correct, **components},
            explanation=f"answer {answer!r} vs total {total}",
        )
'''

TEST = '''\
"""$name-v1 keeps the Env contract, and its grader tells right answers from wrong ones."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from rldojo.envs.check import check_env
from rldojo.types import Rollout, Score, Task

from $name.env import ${camel}Env


def call(item: str) -> str:
    body = json.dumps({"name": "price", "arguments": {"item": item}})
    return f"<tool_call>{body}</tool_call>"


async def play(env: ${camel}Env, task: Task, turns: list[str]) -> Score:
    """Play `turns` as the policy, then grade the episode the way the trainer does."""
    obs = await env.reset(task, seed=0)
    messages, info = list(obs.messages), {}
    for turn in turns:
        result = await env.step(turn)
        messages += [{"role": "assistant", "content": turn}, *result.messages]
        info.update(result.info)
        if result.done:
            break
    rollout = Rollout(task.id, env.env_id, messages, completion=turns[-1], info=info)
    return await env.default_grader().grade(rollout, task)


def test_env_passes_check_env():
    report = check_env(${camel}Env)
    assert report.ok, str(report)


def test_grader_scores_a_right_and_a_wrong_answer():
    env = ${camel}Env()
    task = env.tasks("train", seed=0, n=1)[0]
    lookups = "".join(call(item) for item in task.info["bill"])
    right = asyncio.run(play(env, task, [lookups, f"<answer>{task.answer}</answer>"]))
    wrong = asyncio.run(play(env, task, [lookups, "<answer>1</answer>"]))
    assert right.value == 1.0 and right.components["tool_calls"] == len(task.info["bill"])
    assert wrong.value == 0.0


def test_a_malformed_tool_call_costs_reward():
    env = ${camel}Env()
    task = env.tasks("train", seed=0, n=1)[0]
    broken = asyncio.run(play(env, task, ["<tool_call>{oops</tool_call>", "<answer>1</answer>"]))
    assert broken.value is not None and broken.value < 0.0
    assert broken.components["protocol_errors"] == 1.0


def test_grader_fails_without_a_reference_answer():
    env = ${camel}Env()
    task = dataclasses.replace(env.tasks("train", seed=0, n=1)[0], answer=None)
    score = asyncio.run(play(env, task, ["<answer>1</answer>"]))
    assert score.value is None and score.status == "invalid"
'''

TRAIN = """\
# Train $name-v1 (a tool environment) with rldojo. From this directory:
#
#   rldojo train train.toml
#
# env.id is a module:factory path, imported from the current directory (like
# `python -m`). After `pip install -e .` the registered id works anywhere:
# id = "$name-v1".

[model]
# tiny-random: a 2-layer model with random weights. It checks the plumbing in seconds
# and learns nothing. To really train, use: name = "smollm2-135m-instruct"
name = "tiny-random"

[env]
id = "$name.env:${camel}Env"
kwargs = { items = 2 }

[sampling]
max_new_tokens = 96
temperature = 0.8

[rollout]
prompts_per_step = 4
group_size = 4
max_turns = 4

[eval]
tasks = 8
max_new_tokens = 96

[run]
steps = 5
seed = 0
"""
