"""mcq-v1: multiple-choice questions, procedural or from a file, in any display format.

Built-in items (no file, no network) come in two kinds: arithmetic ("What is 17 + 25?"
with near-miss distractors) and categories ("Which of these is a fruit?"). With
`path=`, items come from a JSONL/JSON/Parquet file of rows

    {"id": "q1", "question": "...", "options": ["...", "..."], "answer": 2}

where `options` may be called `choices`, and `answer` is the option's index, its letter
(``"C"``) or its text. Bad rows raise `DataError` naming the file, line and field.

The display format (label scheme, option order, template, answer instruction) is an
`rldojo.envs.mcq.items.MCFormat`, set by the `labels`, `order_seed`, `template` and
`instruction` kwargs (`MCQKwargs`); the robustness probes re-render the same tasks under other
formats. The reward is ``correct - format_penalty * (1 - format)``, where `correct` is
judged on the chosen option's content (`MultipleChoiceGrader`).

Splits: a fixed 20% of questions (by a hash of the text) are test; ``tasks(split,
seed=s)`` is deterministic and a prefix of a longer list equals a shorter list.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Collection
from pathlib import Path

from pydantic import ValidationInfo, field_validator

from rldojo.data.loading import DataError, read_rows, require_any_field
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.kwargs import EnvKwargs, given_kwargs
from rldojo.envs.mcq.items import (
    LABEL_SCHEMES,
    MC_INSTRUCTIONS,
    MC_TEMPLATES,
    MCFormat,
    MCItem,
    mc_reward,
    mc_task,
)
from rldojo.envs.registry import register
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader
from rldojo.types import Task

__all__ = ["MCQEnv", "MCQKwargs", "builtin_item", "load_items"]

ENV_ID = "mcq-v1"
TEST_SHARE = 0.2
DEFAULT_N = {"train": 1000, "test": 200}
DEFAULT_SYSTEM_PROMPT = "You are a concise assistant."
PLAIN = MCFormat()
"""The display format unless the kwargs say otherwise."""

_CATEGORIES: dict[str, tuple[str, ...]] = {
    "a fruit": ("apple", "banana", "cherry", "mango", "pear", "grape", "peach", "plum"),
    "an animal": ("horse", "tiger", "rabbit", "eagle", "whale", "zebra", "otter", "goat"),
    "a colour": ("red", "green", "purple", "orange", "yellow", "brown", "violet", "grey"),
    "a tool": ("hammer", "wrench", "saw", "drill", "chisel", "shovel", "pliers", "axe"),
    "a vehicle": ("bus", "truck", "bicycle", "tractor", "scooter", "van", "tram", "canoe"),
}


def _is_test(question: str) -> bool:
    digest = hashlib.sha256(f"{ENV_ID}-split:{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < TEST_SHARE


def _arith_item(rng: random.Random) -> MCItem:
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    right = a + b
    wrong = {right + 1, right - 1, right + 10, right - 10, right + 2}
    distractors = rng.sample(sorted(w for w in wrong if w > 0), 3)
    options = [str(right), *map(str, distractors)]
    rng.shuffle(options)
    return MCItem(f"What is {a} + {b}?", tuple(options), options.index(str(right)))


def _category_item(rng: random.Random) -> MCItem:
    names = sorted(_CATEGORIES)
    target = rng.choice(names)
    others = rng.sample([n for n in names if n != target], 3)
    options = [rng.choice(_CATEGORIES[target])] + [rng.choice(_CATEGORIES[o]) for o in others]
    right = options[0]
    rng.shuffle(options)
    return MCItem(f"Which of these is {target}?", tuple(options), options.index(right))


def builtin_item(rng: random.Random) -> MCItem:
    """One procedural item (arithmetic or category), drawn with `rng`."""
    return _arith_item(rng) if rng.random() < 0.5 else _category_item(rng)


def _answer_index(raw: object, options: list[str], path: str, line: int) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(options):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        if len(text) == 1 and text.upper() in "ABCDEFGHIJ"[: len(options)]:
            return "ABCDEFGHIJ".index(text.upper())
        if text in options:
            return options.index(text)
    raise DataError(path, line, f"field 'answer': {raw!r} is not an option index, letter or text")


def load_items(path: str | os.PathLike[str]) -> list[tuple[str, MCItem]]:
    """``(id, item)`` pairs of a multiple-choice file (see the module docstring)."""
    source = os.fspath(path)
    items = []
    for line, row in read_rows(source):
        _, question = require_any_field(row, ("question", "prompt"), source, line)
        _, options = require_any_field(row, ("options", "choices"), source, line, (list,))
        if len(options) < 2 or not all(isinstance(o, str) for o in options):
            raise DataError(source, line, "field 'options': need >= 2 strings")
        if "answer" not in row:
            raise DataError(source, line, "field 'answer': missing")
        index = _answer_index(row["answer"], options, source, line)
        ident = str(row.get("id", f"{os.path.basename(source)}:{line}"))
        items.append((ident, MCItem(question, tuple(options), index)))
    if not items:
        raise DataError(source, None, "no rows")
    return items


class MCQKwargs(EnvKwargs):
    """The kwargs of mcq-v1 (`[env] kwargs`)."""

    path: str | Path | None = None
    """A JSONL/JSON/Parquet file of items (module docstring); None: the built-in items."""
    labels: str = PLAIN.labels
    """Label scheme: ``letters`` (A. B.), ``numbers`` (1. 2.), ``paren`` (a) b)) or
    ``bracketed`` ((A) (B))."""
    order_seed: int | None = PLAIN.order_seed
    """Shuffle each item's options with this seed; None keeps the original order."""
    template: str = PLAIN.template
    """Prompt template: ``plain``, ``qa`` or ``instruction_first``."""
    instruction: str = PLAIN.instruction
    """Answer instruction: ``default``, ``terse`` or ``think``."""
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """The system message; None for none."""
    format_penalty: float = FORMAT_PENALTY
    """Reward lost when the ``Answer:`` line is missing."""

    @field_validator("labels", "template", "instruction")
    @classmethod
    def _known(cls, value: str, info: ValidationInfo) -> str:
        tables: dict[str, Collection[str]] = {
            "labels": LABEL_SCHEMES,
            "template": MC_TEMPLATES,
            "instruction": MC_INSTRUCTIONS,
        }
        table = tables[str(info.field_name)]
        if value not in table:
            raise ValueError(f"expected one of {', '.join(map(repr, table))}")
        return value


class MCQEnv(SingleTurnEnv):
    """Multiple-choice questions (see the module docstring); built from `MCQKwargs` (or
    keywords validated against it)."""

    env_id = ENV_ID
    Kwargs = MCQKwargs

    def __init__(self, kwargs: MCQKwargs | None = None, /, **keywords: object) -> None:
        super().__init__()
        k = self.kwargs = given_kwargs(ENV_ID, MCQKwargs, kwargs, keywords)
        self.format = MCFormat(k.labels, k.order_seed, k.template, k.instruction)
        self.items = load_items(k.path) if k.path is not None else None
        self.system_prompt = k.system_prompt

    @property
    def expected_answer(self) -> str:
        """What the grader extracts an answer from (`rldojo.training.no_signal` names it)."""
        return f"a line 'Answer: <{LABEL_SCHEMES[self.format.labels][2]}>'"

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in DEFAULT_N:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        if self.items is not None:
            chosen = [(i, it) for i, it in self.items if _is_test(it.question) == (split == "test")]
            random.Random(f"{ENV_ID}:{split}:{seed}").shuffle(chosen)
            chosen = chosen if n is None else chosen[:n]
            return [mc_task(f"{ENV_ID}/{i}", it, self.format, env=ENV_ID) for i, it in chosen]
        count = DEFAULT_N[split] if n is None else n
        tasks, seen = [], set()
        for i in range(count):
            rng = random.Random(f"{ENV_ID}:{split}:{seed}:{i}")
            for _ in range(10_000):
                item = builtin_item(rng)
                if _is_test(item.question) == (split == "test") and item.question not in seen:
                    break
            else:
                raise ValueError(f"{ENV_ID}: ran out of distinct {split} questions")
            seen.add(item.question)
            tid = f"{ENV_ID}/{split}/{seed}/{i}"
            tasks.append(mc_task(tid, item, self.format, env=ENV_ID))
        return tasks

    def default_grader(self) -> CompositeGrader:
        """``correct - format_penalty * (1 - format)``, correctness by the option chosen."""
        return mc_reward(self.kwargs.format_penalty)


register(ENV_ID, MCQEnv)
