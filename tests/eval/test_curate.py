"""Difficulty curation: bands, pass-rate estimates with early stopping, task files, histogram."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter

import pytest

from rldojo.data.loading import DataError
from rldojo.envs.registry import make_env
from rldojo.eval.curate import (
    Band,
    PassRate,
    estimate_pass_rates,
    histogram,
    histogram_text,
    load_tasks,
    task_row,
)
from rldojo.policy.adapters import callable_policy
from rldojo.types import SamplingParams, Task

_Q = re.compile(r"What is (\d+) \+ (\d+)\?")


def test_band_parse_and_contains():
    open_band = Band.parse("(0,1)")
    assert not open_band.contains(0.0) and open_band.contains(0.5) and not open_band.contains(1.0)
    closed = Band.parse("[0.1, 0.7]")
    assert closed.contains(0.1) and closed.contains(0.7) and not closed.contains(0.75)
    assert Band.parse("0.1-0.7") == closed and str(closed) == "[0.1, 0.7]"
    assert Band.parse("(0.2,1]") == Band(0.2, 1.0, False, True)
    for bad in ("0.1", "(0.5,0.2)", "[0,2]", "(0,1"):
        with pytest.raises(ValueError):
            Band.parse(bad)


def test_decided_membership():
    band = Band()  # (0, 1)
    assert PassRate(Task("t", "q"), samples=2, passes=1, drawn=2).decided(band, 8)
    assert not PassRate(Task("t", "q"), samples=2, passes=2, drawn=2).decided(band, 8)
    assert PassRate(Task("t", "q"), samples=4, passes=0, drawn=4).decided(band, 4)  # final
    # [0.5, 1]: 3 passes of 4 drawn with 4 to go can end anywhere in 3/8..7/8: undecided
    assert not PassRate(Task("t", "q"), samples=4, passes=3, drawn=4).decided(
        Band(0.5, 1, True, True), 8
    )


def _graded_policy(tasks: list[Task]):
    """Task i (i = 0..4) is answered right on exactly i of every 4 calls."""
    level = {t.info["question"]: i for i, t in enumerate(tasks)}
    calls: Counter[str] = Counter()

    def answer(messages):
        text = messages[-1]["content"]
        question = _Q.search(text).group(0)
        calls[question] += 1
        a, b = map(int, _Q.search(text).groups())
        right = calls[question] % 4 < level[question]
        return f"Answer: {a + b if right else a + b + 1}"

    return callable_policy(answer)


def _estimate(tasks, **kw):
    return asyncio.run(
        estimate_pass_rates(tasks, _graded_policy(tasks), make_env, SamplingParams(), **kw)
    )


def test_estimates_pass_rates_and_keeps_the_band():
    tasks = make_env("arith-v1").tasks("test", n=5)
    found = _estimate(tasks, samples=4)
    assert [(e.passes, e.samples, e.failed) for e in found] == [(i, 4, 0) for i in range(5)]
    assert [e.rate for e in found] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert found[1].mean_reward == pytest.approx(0.25)
    kept = [e.task.id for e in found if Band().contains(e.rate)]
    assert kept == [t.id for t in tasks[1:4]]


def test_rounds_stop_tasks_whose_membership_is_decided():
    tasks = make_env("arith-v1").tasks("test", n=5)
    found = _estimate(tasks, samples=4, rounds=2, band=Band())
    assert [e.drawn for e in found] == [4, 4, 2, 4, 4]  # task 2 showed a pass and a fail
    assert found[2].rate == 0.5 and found[1].passes == 1 and found[3].passes == 3
    assert [Band().contains(e.rate) for e in found] == [False, True, True, True, False]


def test_grader_failures_are_counted_not_failed():
    task = make_env("arith-v1").tasks("test", n=1)[0]
    broken = Task("broken", task.prompt, None, task.info, task.env)  # no reference: invalid
    found = asyncio.run(
        estimate_pass_rates(
            [broken], callable_policy(lambda m: "Answer: 1"), make_env, SamplingParams(), samples=3
        )
    )
    assert (found[0].failed, found[0].samples, found[0].rate) == (3, 0, None)


def test_histogram_rows():
    ests = [
        PassRate(Task(str(i), "q"), samples=4, passes=p, drawn=4)
        for i, p in enumerate([0, 1, 1, 4])
    ]
    assert histogram(ests) == [("0/4", 1), ("1/4", 2), ("2/4", 0), ("3/4", 0), ("4/4", 1)]
    mixed = [
        *ests,
        PassRate(Task("x", "q"), samples=3, passes=3, drawn=3),
        PassRate(Task("y", "q")),
    ]
    rows = histogram(mixed, bins=2)
    assert rows == [("0.0-0.5", 3), ("0.5-1.0", 2), ("n/a", 1)]
    assert "█" in histogram_text(rows)


def test_task_files_round_trip_and_errors(tmp_path):
    tasks = make_env("arith-v1").tasks("test", n=2)
    path = tmp_path / "tasks.jsonl"
    rows = [task_row(t, pass_rate=0.5) for t in tasks]
    rows.append({"problem": "What is 2 + 2?", "answer": 4, "level": 9})
    rows.append({"id": "chat", "prompt": [{"role": "user", "content": "hi"}], "env": "mcq-v1"})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = load_tasks(path, "arith-v1", make_env)
    assert loaded[0] == tasks[0].__class__(
        **{**tasks[0].__dict__, "info": {**tasks[0].info, "pass_rate": 0.5}}
    )
    bare = loaded[2]
    assert bare.prompt.startswith("What is 2 + 2?\nSolve the problem.") and bare.answer == "4"
    assert bare.info == {"level": 9, "question": "What is 2 + 2?"} and bare.env == "arith-v1"
    assert loaded[3].env == "mcq-v1" and loaded[3].prompt == [{"role": "user", "content": "hi"}]
    # A curated file trains as math-v1 without a second answer instruction.
    curated = tmp_path / "kept.jsonl"
    curated.write_text("\n".join(json.dumps(r) for r in rows[:2]))
    math = make_env("math-v1", path=str(curated), prompt_field="question", test_fraction=0.0)
    by_answer = {t.answer: t for t in math.tasks("train")}
    assert by_answer[tasks[0].answer].prompt.count("Answer:") == 1
    assert by_answer[tasks[0].answer].info["pass_rate"] == 0.5
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(DataError, match=r"tasks\.jsonl:2.*duplicate"):
        load_tasks(path, "arith-v1")
    path.write_text('{"id": "a", "answer": "1"}\n')
    with pytest.raises(
        DataError, match=re.escape("tasks.jsonl:1: field 'prompt|problem|question'")
    ):
        load_tasks(path, "arith-v1")
