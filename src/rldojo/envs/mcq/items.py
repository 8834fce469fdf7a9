"""Multiple-choice items: rendering under label schemes, option orders and templates; grading.

An item is a question, its options and the index of the correct one (`MCItem`). How it is
shown is an `MCFormat`: the label scheme (``A. B. C.``, ``1. 2. 3.``, ``a) b) c)``), the
option order (a seeded shuffle per item, or the original order), the prompt template and
the answer instruction. `mc_task` renders an item into a `Task` whose `info` keeps the
item and the mapping from shown labels to options, so `MultipleChoiceGrader` grades the
*content* chosen: picking the right option is correct under every format, which is what
the robustness probes (`rldojo.eval.perturb`) rely on.

Scores move under such relabelling (the issue cites several points); numeric labels over
numeric options are genuinely ambiguous ("Answer: 2"), and the grader reads the answer as
a label first, as the instruction asks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader
from rldojo.graders.rules import NO_ANSWER_FLAG, FormatGrader, extract_answer, normalize_answer
from rldojo.types import Rollout, Score, Task

__all__ = [
    "LABEL_SCHEMES",
    "MC_INSTRUCTIONS",
    "MC_TEMPLATES",
    "MCFormat",
    "MCItem",
    "MultipleChoiceGrader",
    "item_from_task",
    "mc_reward",
    "mc_task",
    "parse_choice",
    "render",
]

LABEL_SCHEMES: dict[str, tuple[str, str, str]] = {
    # name: (label alphabet, how an option line is written, what a label is called)
    "letters": ("ABCDEFGHIJ", "{label}. {option}", "letter"),
    "numbers": ("123456789", "{label}. {option}", "number"),
    "paren": ("abcdefghij", "{label}) {option}", "letter"),
    "bracketed": ("ABCDEFGHIJ", "({label}) {option}", "letter"),
}
MC_TEMPLATES: dict[str, str] = {
    "plain": "{question}\n\n{options}\n\n{instruction}",
    "qa": "Question: {question}\nOptions:\n{options}\n\n{instruction}",
    "instruction_first": "{instruction}\n\n{question}\n{options}",
}
MC_INSTRUCTIONS: dict[str, str] = {
    "default": ("Choose the correct option. End with a line of the form 'Answer: <{kind}>'."),
    "terse": "Reply with only 'Answer: <{kind}>'.",
    "think": "Think step by step, then end with a line 'Answer: <{kind}>'.",
}


@dataclass(frozen=True)
class MCItem:
    """A question, its options (original order) and the index of the correct option."""

    question: str
    options: tuple[str, ...]
    correct: int

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ValueError(f"a multiple-choice item needs >= 2 options, got {self.options}")
        if not 0 <= self.correct < len(self.options):
            raise ValueError(f"correct index {self.correct} out of range for {self.options}")


@dataclass(frozen=True)
class MCFormat:
    """How an item is shown. `order_seed` None keeps the original option order."""

    labels: str = "letters"
    order_seed: int | None = None
    template: str = "plain"
    instruction: str = "default"

    def __post_init__(self) -> None:
        for value, table in (
            (self.labels, LABEL_SCHEMES),
            (self.template, MC_TEMPLATES),
            (self.instruction, MC_INSTRUCTIONS),
        ):
            if value not in table:
                raise ValueError(f"unknown format value {value!r}; known: {sorted(table)}")


@dataclass(frozen=True)
class Rendered:
    """An item as shown: prompt, labels, option order and the right label."""

    prompt: str
    labels: tuple[str, ...]
    order: tuple[int, ...]
    """``order[shown_position] = original option index``."""
    correct_shown: int

    @property
    def answer(self) -> str:
        return self.labels[self.correct_shown]


def option_order(item: MCItem, seed: int | None) -> tuple[int, ...]:
    """The shown order of the options: identity, or a shuffle seeded by seed and item."""
    order = list(range(len(item.options)))
    if seed is not None:
        random.Random(f"mcq-order:{seed}:{item.question}").shuffle(order)
    return tuple(order)


def render(item: MCItem, fmt: MCFormat) -> Rendered:
    """The prompt text of `item` under `fmt`, with the label -> option mapping."""
    alphabet, line, kind = LABEL_SCHEMES[fmt.labels]
    if len(item.options) > len(alphabet):
        raise ValueError(f"label scheme {fmt.labels!r} has only {len(alphabet)} labels")
    order = option_order(item, fmt.order_seed)
    labels = tuple(alphabet[: len(order)])
    options = "\n".join(
        line.format(label=label, option=item.options[i])
        for label, i in zip(labels, order, strict=True)
    )
    instruction = MC_INSTRUCTIONS[fmt.instruction].format(kind=kind)
    prompt = MC_TEMPLATES[fmt.template].format(
        question=item.question, options=options, instruction=instruction
    )
    return Rendered(prompt, labels, order, order.index(item.correct))


def mc_task(task_id: str, item: MCItem, fmt: MCFormat = MCFormat(), *, env: str = "") -> Task:
    """A `Task` showing `item` under `fmt`; `info` carries what the grader needs."""
    shown = render(item, fmt)
    info = {
        "question": item.question,
        "options": list(item.options),
        "correct": item.correct,
        "format": asdict(fmt),
        "labels": list(shown.labels),
        "order": list(shown.order),
        "correct_shown": shown.correct_shown,
    }
    return Task(id=task_id, prompt=shown.prompt, answer=shown.answer, info=info, env=env)


def item_from_task(task: Task) -> tuple[MCItem, MCFormat] | None:
    """The item and format of a task made by `mc_task`; None for other tasks."""
    info = task.info
    if "options" not in info or "correct" not in info:
        return None
    item = MCItem(str(info["question"]), tuple(str(o) for o in info["options"]), info["correct"])
    fmt = MCFormat(**dict(info.get("format", {})))
    return item, fmt


def reformat(task: Task, **changes: Any) -> Task:
    """The same multiple-choice task shown with some `MCFormat` fields changed."""
    parsed = item_from_task(task)
    if parsed is None:
        raise ValueError(f"task {task.id} is not a multiple-choice task")
    item, fmt = parsed
    return mc_task(task.id, item, replace(fmt, **changes), env=task.env)


_LABEL_TOKEN = re.compile(r"^[\s(\[]*([A-Za-z]|\d{1,2})\s*[)\].:]?(?:\s|$)")


def parse_choice(text: str, labels: Sequence[str], options: Sequence[str]) -> int | None:
    """The shown position the completion chose, or None.

    The ``Answer:`` value (see `rldojo.graders.rules.extract_answer`) is read as a label
    first (``B``, ``(b)``, ``2.``, ``B) 42``; letters case-insensitively), then as the
    text of a shown option.
    """
    value = extract_answer(text)
    if value is None:
        return None
    match = _LABEL_TOKEN.match(value)
    if match:
        token = match.group(1).lower()
        for position, label in enumerate(labels):
            if label.lower() == token:
                return position
    wanted = normalize_answer(value)
    for position, option in enumerate(options):
        if normalize_answer(option) == wanted:
            return position
    return None


class MultipleChoiceGrader:
    """1.0 when the chosen option is the correct one (by content), else 0.0.

    Reads the labels and option order from the task (`mc_task`), so it grades any
    relabelled or reordered rendering. A task without them is `invalid`. A completion with
    no ``Answer:`` value at all is flagged `no_answer` (`rldojo.graders.rules`).
    """

    name = "multiple_choice"
    version = "1"

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = {"grader": self.name, "version": self.version}
        info: Mapping[str, Any] = task.info
        if not {"labels", "order", "options", "correct_shown"} <= set(info):
            return Score.failed(
                "invalid", f"task {task.id} is not a multiple-choice task", provenance=prov
            )
        shown = [info["options"][i] for i in info["order"]]
        choice = parse_choice(rollout.completion, info["labels"], shown)
        value = 1.0 if choice == info["correct_shown"] else 0.0
        chosen = "none" if choice is None else info["labels"][choice]
        found = choice is not None or extract_answer(rollout.completion) is not None
        return Score(
            value,
            components={"correct": value},
            flags=() if found else (NO_ANSWER_FLAG,),
            explanation=f"chose {chosen}, correct {info['labels'][info['correct_shown']]}",
            provenance=prov,
        )


def mc_reward(format_penalty: float = FORMAT_PENALTY) -> CompositeGrader:
    """``correct - format_penalty * (1 - format)``, as for the other answer environments."""
    return CompositeGrader(
        {"correct": MultipleChoiceGrader(), "format": FormatGrader(format_penalty)},
        name="mc_reward",
    )
