"""Templates of the single-turn scaffold: sort the digits of a number, answer in tags."""

DESCRIPTION = "A single-turn rldojo environment: sort the digits of a number"

ENV = '''\
"""$name-v1: sort the digits of a number (a single-turn environment).

The policy sees one question and answers once, in <answer>...</answer> tags; the episode
ends after that answer. To pose your own problems, edit `make_task`; to score them,
edit `${camel}Grader` in grader.py. Check the environment from the project directory:

    rldojo check-env $name.env:${camel}Env --show
"""

from __future__ import annotations

import random

from rldojo.envs.base import SingleTurnEnv
from rldojo.types import Task

from $name.grader import ${camel}Grader

ENV_ID = "$name-v1"
SPLITS = ("train", "test")
DEFAULT_N = 1000
"""Tasks in a split when `tasks` is called without `n`."""


class ${camel}Env(SingleTurnEnv):
    """Sort the digits of a random number from smallest to largest.

    Args:
        length: how many digits each number has.
    """

    env_id = ENV_ID
    system_prompt = "You are a careful assistant."

    def __init__(self, length: int = 5) -> None:
        super().__init__()
        if length < 1:
            raise ValueError(f"{ENV_ID}: length must be at least 1, got {length}")
        self.length = length

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        count = DEFAULT_N if n is None else n
        return [self.make_task(split, seed, i) for i in range(count)]

    def make_task(self, split: str, seed: int, i: int) -> Task:
        """Task `i` of a split. Its own random generator makes it the same on every call.
        Train and test use different generators; they can still share a number by chance."""
        rng = random.Random(f"{ENV_ID}:{split}:{seed}:{i}")
        digits = "".join(rng.choice("0123456789") for _ in range(self.length))
        return Task(
            id=f"{ENV_ID}/{split}/{seed}/{i}",
            prompt=(
                f"Sort the digits of {digits} from smallest to largest. "
                "Reply with the sorted digits in <answer>...</answer>."
            ),
            answer="".join(sorted(digits)),
            info={"digits": digits},
            env=ENV_ID,
        )

    def default_grader(self) -> ${camel}Grader:
        return ${camel}Grader()
'''

GRADER = '''\
"""The grader of $name-v1: the answer in <answer> tags against the task's reference.

A grader follows `rldojo.graders.base.Grader`: a `name` and an async `grade(rollout,
task)` that returns a `Score`. Reward: 1.0 for the right answer, 0.0 for a wrong one,
and FORMAT_PENALTY less when the <answer> tags are missing. When the grader cannot judge
a rollout (here: the task has no reference answer) it returns `Score.failed(...)`, never
0.0, so the trainer keeps that sample out of the gradient.
"""

from __future__ import annotations

import re

from rldojo.types import Rollout, Score, Task

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FORMAT_PENALTY = 0.5


def extract_answer(text: str) -> str | None:
    """The text inside the last <answer>...</answer>, stripped; None when there is none."""
    found = ANSWER.findall(text)
    return found[-1].strip() if found else None


class ${camel}Grader:
    """Scores the final policy turn (`rollout.completion`) against `task.answer`."""

    name = "$name"

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        if task.answer is None:
            return Score.failed("invalid", f"task {task.id} has no reference answer")
        answer = extract_answer(rollout.completion)
        correct = float(answer == task.answer)
        tagged = float(answer is not None)
        return Score(
            correct - FORMAT_PENALTY * (1.0 - tagged),
            components={"correct": correct, "format": tagged},
            explanation=f"answer {answer!r} vs reference {task.answer!r}",
        )
'''

TEST = '''\
"""$name-v1 keeps the Env contract, and its grader tells right answers from wrong ones."""

from __future__ import annotations

import asyncio
import dataclasses

from rldojo.envs.check import check_env
from rldojo.types import Rollout, Score, Task

from $name.env import ${camel}Env


def grade(env: ${camel}Env, task: Task, completion: str) -> Score:
    rollout = Rollout(task_id=task.id, env=env.env_id, messages=[], completion=completion)
    return asyncio.run(env.default_grader().grade(rollout, task))


def test_env_passes_check_env():
    report = check_env(${camel}Env)
    assert report.ok, str(report)


def test_grader_scores_a_right_and_a_wrong_answer():
    env = ${camel}Env()
    task = env.tasks("train", seed=0, n=1)[0]
    assert grade(env, task, f"<answer>{task.answer}</answer>").value == 1.0
    assert grade(env, task, "<answer>12345x</answer>").value == 0.0
    assert grade(env, task, f"{task.answer}").value == -0.5  # right, but no tags


def test_grader_fails_without_a_reference_answer():
    env = ${camel}Env()
    task = dataclasses.replace(env.tasks("train", seed=0, n=1)[0], answer=None)
    score = grade(env, task, "<answer>1</answer>")
    assert score.value is None and score.status == "invalid"
'''

TRAIN = """\
# Train $name-v1 with rldojo. From this directory:
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
kwargs = { length = 5 }

[sampling]
max_new_tokens = 32
temperature = 0.8

[rollout]
prompts_per_step = 4
group_size = 4

[eval]
tasks = 8

[run]
steps = 5
seed = 0
"""
