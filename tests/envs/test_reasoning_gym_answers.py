"""reasoning-gym-v1's answers: the forms a small model writes are graded, a wrong answer
is wrong, format is its own component, and `rldojo demos --from-answers` builds passing
demonstrations from the tasks' reference answers. Needs the optional reasoning-gym."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.reasoning_gym.grader import final_answer
from rldojo.envs.registry import make_env
from rldojo.graders.rules import NO_ANSWER_FLAG
from rldojo.types import Rollout

pytest.importorskip("reasoning_gym")

FORMS = [
    "Adding up: <answer>{a}</answer>",
    "3 + 4 = 7, so... The final answer is {a}.",
    "So, the answer is {a}.",
    "the answer is **{a}**",
    "Working.\nAnswer: {a}",
    "Final answer: {a}",
    "Thus $\\boxed{{{a}}}$",
    "The final answer is $\\boxed{{{a}}}$.",
    "The answer is 3? No. Recounting, the answer is {a}.",
    "I first guessed Answer: 1, but the answer is {a}.",
]


@pytest.fixture(scope="module")
def env_and_task():
    env = make_env("reasoning-gym-v1", dataset="basic_arithmetic", config={"max_terms": 3})
    return env, env.tasks("train", seed=1, n=1)[0]


def grade(env, task, text):
    grader = env.default_grader()
    return asyncio.run(grader.grade(Rollout(task.id, env.env_id, [], text), task))


@pytest.mark.parametrize("form", FORMS)
def test_each_accepted_form_is_graded_right(env_and_task, form):
    env, task = env_and_task
    text = form.format(a=task.answer)
    assert final_answer(text) == task.answer
    score = grade(env, task, text)
    assert score.ok and score.value == 1.0 and score.components["correct"] == 1.0
    assert score.components["format"] == 1.0
    assert score.components["tagged"] == (1.0 if "<answer>" in form else 0.0)


@pytest.mark.parametrize("form", FORMS)
def test_a_wrong_answer_is_wrong_in_every_form(env_and_task, form):
    env, task = env_and_task
    wrong = str(int(task.answer) + 1)
    score = grade(env, task, form.format(a=wrong))
    assert score.ok and score.value == 0.0 and score.components["correct"] == 0.0


def test_no_answer_is_flagged_and_only_loses_the_format_penalty(env_and_task):
    env, task = env_and_task
    score = grade(env, task, f"I am not sure, maybe {task.answer} or so")
    assert NO_ANSWER_FLAG in score.flags and score.value == 0.0
    assert score.components["format"] == 0.0
    strict = make_env("reasoning-gym-v1", dataset="basic_arithmetic", format_penalty=0.1)
    assert grade(strict, task, "no idea").value == -0.1


def test_demos_from_answers_writes_n_passing_rows(tmp_path):
    out = tmp_path / "demos.jsonl"
    kwargs = json.dumps({"datasets": {"leg_counting": 1, "basic_arithmetic": 2}})
    result = CliRunner().invoke(app, ["demos", "reasoning-gym-v1", "--from-answers", "--n", "12",
                                      "--out", str(out), "--env-kwargs", kwargs])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and len({r["task_id"] for r in rows}) == 12
    assert all(r["passed"] and r["score"] == 1.0 and r["source"] == "answers" for r in rows)
    env = make_env("reasoning-gym-v1", datasets={"leg_counting": 1, "basic_arithmetic": 2})
    answers = {t.id: t.answer for t in env.tasks("train", seed=0, n=12)}
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert row["messages"][1]["content"] == f"<answer>{answers[row['task_id']]}</answer>"


def test_from_answers_excludes_the_other_actors(tmp_path):
    args = ["demos", "arith-v1", "--from-answers", "--expert", "x", "--out", str(tmp_path / "d")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "exclude each other" in result.output
