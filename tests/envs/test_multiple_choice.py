"""Multiple-choice rendering, label mapping under perturbations, parsing, grading, mcq-v1."""

from __future__ import annotations

import asyncio
import json

import pytest

from rldojo.data.loading import DataError
from rldojo.envs.mcq.items import (
    MCFormat,
    MCItem,
    MultipleChoiceGrader,
    item_from_task,
    mc_task,
    parse_choice,
    render,
)
from rldojo.envs.registry import make_env
from rldojo.types import Rollout

ITEM = MCItem("Which is prime?", ("4", "6", "7", "9"), correct=2)


def _grade(task, completion: str):
    rollout = Rollout(task.id, task.env, [], completion)
    return asyncio.run(MultipleChoiceGrader().grade(rollout, task))


@pytest.mark.parametrize(
    ("fmt", "answer", "line"),
    [
        (MCFormat(), "C", "C. 7"),
        (MCFormat(labels="numbers"), "3", "3. 7"),
        (MCFormat(labels="paren"), "c", "c) 7"),
        (MCFormat(labels="bracketed"), "C", "(C) 7"),
    ],
)
def test_label_schemes_map_the_same_option(fmt, answer, line):
    shown = render(ITEM, fmt)
    assert shown.answer == answer
    assert line in shown.prompt.splitlines()


def test_shuffled_order_keeps_the_label_on_the_right_content():
    for seed in range(6):
        shown = render(ITEM, MCFormat(order_seed=seed))
        assert sorted(shown.order) == [0, 1, 2, 3]
        assert ITEM.options[shown.order[shown.correct_shown]] == "7"
        assert f"{shown.answer}. 7" in shown.prompt
    orders = {render(ITEM, MCFormat(order_seed=s)).order for s in range(6)}
    assert len(orders) > 1  # seeds really reorder
    assert render(ITEM, MCFormat(order_seed=3)).order == render(ITEM, MCFormat(order_seed=3)).order


def test_grader_judges_content_under_every_format():
    for fmt in (MCFormat(), MCFormat("numbers", 1), MCFormat("paren", 2, "qa", "terse")):
        task = mc_task("t", ITEM, fmt)
        assert item_from_task(task) == (ITEM, fmt)
        right = task.answer
        wrong = next(label for label in task.info["labels"] if label != right)
        assert _grade(task, f"Answer: {right}").value == 1.0
        assert _grade(task, f"Answer: ({right})").value == 1.0
        assert _grade(task, f"Answer: {wrong}").value == 0.0
        assert _grade(task, "Answer: 7").value == 1.0  # by option text (7 is no label)
        assert _grade(task, "no idea").value == 0.0


def test_parse_choice_label_first_then_option_text():
    labels, options = ["1", "2", "3"], ["2", "5", "8"]
    assert parse_choice("Answer: 2", labels, options) == 1  # a label, not the option "2"
    assert parse_choice("Answer: 8", labels, options) == 2  # not a label: the option text
    assert parse_choice("Answer: B) five", ["A", "B"], ["four", "five"]) == 1
    assert parse_choice("Answer: b", ["A", "B"], ["x", "y"]) == 1
    assert parse_choice("nothing", ["A"], ["x"]) is None


def test_mcq_env_builtin_and_file(tmp_path):
    env = make_env("mcq-v1", labels="numbers", order_seed=1)
    tasks = env.tasks("test", n=5)
    assert len({t.id for t in tasks}) == 5 and tasks == env.tasks("test", n=5)
    assert all(t.answer in "1234" for t in tasks)
    train_q = {t.info["question"] for t in env.tasks("train", n=200)}
    assert not train_q & {t.info["question"] for t in env.tasks("test", n=50)}
    data = tmp_path / "q.jsonl"
    rows = [
        {"id": f"q{i}", "question": f"Q{i}?", "options": ["a", "b", "c"], "answer": i % 3}
        for i in range(30)
    ]
    rows[0]["answer"] = "B"
    rows[1]["answer"] = "c"  # option text
    data.write_text("\n".join(json.dumps(r) for r in rows))
    env = make_env("mcq-v1", path=str(data))
    by_id = {t.id: t for t in env.tasks("train") + env.tasks("test")}
    assert by_id["mcq-v1/q0"].answer == "B" and by_id["mcq-v1/q1"].answer == "C"
    data.write_text(json.dumps({"question": "x", "options": ["a", "b"], "answer": "Z"}))
    with pytest.raises(DataError, match=r"q\.jsonl:1.*answer"):
        make_env("mcq-v1", path=str(data))
