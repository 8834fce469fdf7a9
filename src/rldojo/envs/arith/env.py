"""arith-v1: procedural arithmetic and one-sentence word problems, in four levels.

Level 1: ``a + b`` with a, b in 2..50.
Level 2: ``a - b`` (a, b in 2..50, never negative) or ``a * b`` (a, b in 2..12).
Level 3: two operations, e.g. ``a + b * c``, ``(a + b) * c``, ``a * b - c`` (never negative).
Level 4: word problems from a few templates ("Tom has 12 apples and buys 7 more. How
         many apples does Tom have now?"): add, take away, groups of, share equally, and
         a two-step one.

The user message is the question followed by the answer instruction
(`rldojo.graders.rules.answer_instruction`), and the policy must end with
``Answer: <number>``. The reward (`rldojo.graders.composite.answer_reward`) is

    correct - format_penalty * (1 - format)        # 1, 0, or -0.5 by default

where `correct` is judged by math-verify (plain numbers are compared exactly in-process).

Tasks are deterministic: item ``i`` of ``tasks(split, seed=s)`` comes from its own
``random.Random(f"arith-v1:{split}:{s}:{i}")``, so a prefix of a longer list equals a
shorter list. Train and test never share a question, for any seeds and sizes: each
question text belongs to one split by a hash of its text (`TEST_SHARE` of the space goes
to test), and test questions are also distinct from each other.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

from pydantic import Field, field_validator

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.kwargs import EnvKwargs, given_kwargs, subset_of
from rldojo.envs.registry import register
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader, answer_reward
from rldojo.graders.rules import answer_instruction
from rldojo.types import Task

__all__ = [
    "ARITH_INSTRUCTION",
    "DEFAULT_SYSTEM_PROMPT",
    "LEVELS",
    "TEST_SHARE",
    "ArithEnv",
    "ArithKwargs",
]

ENV_ID = "arith-v1"
LEVELS = (1, 2, 3, 4)
ARITH_INSTRUCTION = answer_instruction("number")
"""``Solve the problem. End with a line of the form 'Answer: <number>'.``"""
DEFAULT_SYSTEM_PROMPT = "You are a concise math assistant."
TEST_SHARE = 0.2
"""Share of each level's question space reserved for the test split."""
DEFAULT_N = {"train": 1000, "test": 200}
_MAX_TRIES = 20_000
"""Draws per item before giving up (only reachable when the test space is exhausted)."""

Problem = tuple[str, str, int]
"""(question text, Python expression, answer)."""


_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def _binary(a: int, op: str, b: int) -> Problem:
    expr = f"{a} {op} {b}"
    return f"What is {expr}?", expr, _OPS[op](a, b)


def _level1(rng: random.Random) -> Problem:
    return _binary(rng.randint(2, 50), "+", rng.randint(2, 50))


def _level2(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        return _binary(max(a, b), "-", min(a, b))
    return _binary(rng.randint(2, 12), "*", rng.randint(2, 12))


_SMALL, _MID, _LARGE = (2, 9), (2, 12), (2, 50)
_LEVEL3_FORMS: tuple[
    tuple[str, Callable[[int, int, int], int], tuple[tuple[int, int], ...]], ...
] = (
    # (expression, its value, ranges of a, b, c); every intermediate result is >= 0
    ("{a} + {b} * {c}", lambda a, b, c: a + b * c, (_LARGE, _MID, _MID)),
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c, (_MID, _MID, _LARGE)),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c, (_MID, _MID, _LARGE)),
    ("({a} + {b}) * {c}", lambda a, b, c: (a + b) * c, ((2, 20), (2, 20), _SMALL)),
    ("({a} + {b}) - {c}", lambda a, b, c: (a + b) - c, (_LARGE, _LARGE, _LARGE)),
    ("{a} - {b} + {c}", lambda a, b, c: a - b + c if a >= b else -1, (_LARGE, _LARGE, _LARGE)),
    ("{a} + {b} - {c}", lambda a, b, c: a + b - c, (_LARGE, _LARGE, _LARGE)),
)


def _level3(rng: random.Random) -> Problem:
    form, value_of, ranges = rng.choice(_LEVEL3_FORMS)
    while True:  # redraw the combinations that would go negative
        a, b, c = (rng.randint(lo, hi) for lo, hi in ranges)
        value = value_of(a, b, c)
        if value >= 0:
            expr = form.format(a=a, b=b, c=c)
            return f"What is {expr}?", expr, value


_NAMES = ("Tom", "Anna", "Sam", "Maria", "Ben", "Lucy", "Omar", "Mia", "Leo", "Zoe")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "cards")


def _word_add(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(2, 50), rng.randint(2, 30)
    q = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
    return q, f"{a} + {b}", a + b


def _word_sub(rng: random.Random, name: str, item: str) -> Problem:
    a = rng.randint(5, 50)
    b = rng.randint(1, a - 1)
    q = f"{name} has {a} {item} and gives {b} to a friend. How many {item} does {name} have left?"
    return q, f"{a} - {b}", a - b


def _word_mul(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    q = f"{name} buys {a} boxes with {b} {item} in each box. How many {item} does {name} buy?"
    return q, f"{a} * {b}", a * b


def _word_div(rng: random.Random, name: str, item: str) -> Problem:
    friends, each = rng.randint(2, 9), rng.randint(2, 12)
    total = friends * each
    q = (
        f"{name} shares {total} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return q, f"{total} // {friends}", each


def _word_two_step(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(5, 40), rng.randint(2, 20)
    c = rng.randint(1, a + b - 1)
    q = (
        f"{name} has {a} {item}, buys {b} more, and then gives away {c}. "
        f"How many {item} does {name} have now?"
    )
    return q, f"{a} + {b} - {c}", a + b - c


_WORD_TEMPLATES: tuple[Callable[[random.Random, str, str], Problem], ...] = (
    _word_add,
    _word_sub,
    _word_mul,
    _word_div,
    _word_two_step,
)


def _level4(rng: random.Random) -> Problem:
    template = rng.choice(_WORD_TEMPLATES)
    return template(rng, rng.choice(_NAMES), rng.choice(_ITEMS))


_GENERATORS: dict[int, Callable[[random.Random], Problem]] = {
    1: _level1,
    2: _level2,
    3: _level3,
    4: _level4,
}


def is_test_question(question: str) -> bool:
    """Whether a question text belongs to the test split (a fixed hash of the text)."""
    digest = hashlib.sha256(f"{ENV_ID}-split:{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < TEST_SHARE


class ArithKwargs(EnvKwargs):
    """The kwargs of arith-v1 (`[env] kwargs`)."""

    levels: Sequence[int] = (1,)
    """Difficulty levels to draw from (uniformly per task), a non-empty subset of 1..4."""
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """The system message; None for none."""
    answer_format: str = ARITH_INSTRUCTION
    """The instruction appended to every question."""
    format_penalty: float = FORMAT_PENALTY
    """Reward lost when the ``Answer:`` line is missing."""
    grader_timeout_s: float = Field(5.0, gt=0)
    """Hard timeout of one math-verify comparison, in seconds."""

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, levels: Sequence[int]) -> tuple[int, ...]:
        return subset_of(levels, LEVELS)


class ArithEnv(SingleTurnEnv):
    """Procedural arithmetic (see the module docstring); built from `ArithKwargs` (or
    keywords validated against it)."""

    env_id = ENV_ID
    Kwargs = ArithKwargs
    expected_answer = "a line 'Answer: <number>'"
    """What the grader extracts an answer from (`rldojo.training.no_signal` names it)."""

    def __init__(self, kwargs: ArithKwargs | None = None, /, **keywords: object) -> None:
        super().__init__()
        self.kwargs = given_kwargs(ENV_ID, ArithKwargs, kwargs, keywords)
        self.levels = tuple(self.kwargs.levels)
        self.system_prompt = self.kwargs.system_prompt
        self.answer_format = self.kwargs.answer_format

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in DEFAULT_N:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        count = DEFAULT_N[split] if n is None else n
        if count < 0:
            raise ValueError(f"{ENV_ID}: n must be >= 0, got {n}")
        want_test = split == "test"
        seen: set[str] = set()
        tasks = []
        for i in range(count):
            rng = random.Random(f"{ENV_ID}:{split}:{seed}:{i}")
            level, (question, expr, answer) = self._draw(rng, want_test, seen)
            if want_test:
                seen.add(question)
            tasks.append(
                Task(
                    id=f"{ENV_ID}/{split}/{seed}/{i}",
                    prompt=f"{question}\n{self.answer_format}",
                    answer=str(answer),
                    info={"level": level, "question": question, "expression": expr},
                    env=ENV_ID,
                )
            )
        return tasks

    def _draw(self, rng: random.Random, want_test: bool, seen: set[str]) -> tuple[int, Problem]:
        for _ in range(_MAX_TRIES):
            level = rng.choice(self.levels)
            problem = _GENERATORS[level](rng)
            if is_test_question(problem[0]) == want_test and problem[0] not in seen:
                return level, problem
        raise ValueError(
            f"{ENV_ID}: ran out of distinct test questions for levels {self.levels}; "
            "ask for fewer test tasks or add levels"
        )

    def default_grader(self) -> CompositeGrader:
        """``correct - format_penalty * (1 - format)``, correctness by math-verify."""
        k = self.kwargs
        return answer_reward(format_penalty=k.format_penalty, timeout_s=k.grader_timeout_s)


register(ENV_ID, ArithEnv)
