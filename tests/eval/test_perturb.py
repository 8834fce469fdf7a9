"""Robustness probes: perturbations keep grading right; the report finds spread and flips."""

from __future__ import annotations

import asyncio
import re

import pytest

from rldojo.envs.registry import make_env
from rldojo.eval.harness import evaluate_samples
from rldojo.eval.perturb import Perturbation, default_suite, robustness_report, select_suite
from rldojo.policy.adapters import callable_policy
from rldojo.types import SamplingParams


def test_short_answer_perturbations_keep_question_answer_and_id():
    task = make_env("arith-v1").tasks("test", n=1)[0]
    question = task.info["question"]
    for p in default_suite(multiple_choice=False):
        new = p.apply(task)
        assert (new.id, new.answer, new.env) == (task.id, task.answer, task.env)
        assert question in new.prompt
    assert Perturbation("b").apply(task).prompt == task.prompt  # baseline is the identity
    qa = Perturbation("qa", template="qa").apply(task).prompt
    assert qa.startswith(f"Question: {question}") and "Answer: <number>" in qa
    boxed = Perturbation("x", instruction="boxed").apply(task).prompt
    assert "\\boxed{}" in boxed and "Answer: <number>" not in boxed
    assert Perturbation("n", labels="numbers").apply(task) == task  # no options: unchanged


def test_mc_perturbations_relabel_and_still_grade_the_content():
    env = make_env("mcq-v1")
    grader = env.default_grader()
    tasks = env.tasks("test", n=8)

    def oracle(messages):  # picks the right option by content, whatever the labels
        prompt = messages[-1]["content"]
        task = next(t for t in tasks if t.info["question"] in prompt)
        right = task.info["options"][task.info["correct"]]
        for line in prompt.splitlines():
            m = re.match(r"^\(?([A-Za-z0-9])[.)]\)? (.+)$", line)
            if m and m.group(2) == right:
                return f"Answer: {m.group(1)}"
        return "Answer: ?"

    for p in default_suite(multiple_choice=True):
        perturbed = [p.apply(t) for t in tasks]
        if p.labels == "numbers":
            assert all(t.answer in "1234" for t in perturbed)
        result = asyncio.run(
            evaluate_samples(
                lambda: make_env("mcq-v1"),
                grader,
                callable_policy(oracle),
                perturbed,
                SamplingParams(),
            )
        )
        assert result.statuses() == {"ok": 8}
        assert result.summary((1,))["pass@1"].value == 1.0, p.name


def test_robustness_report_spread_flips_and_paired_difference():
    tasks = [f"t{i}" for i in range(20)]
    outcomes = {
        "baseline": {t: i < 10 for i, t in enumerate(tasks)},
        "labels=numbers": {t: i < 6 for i, t in enumerate(tasks)},
        "shuffle=1": {t: i < 10 for i, t in enumerate(tasks)},
    }
    report = robustness_report(outcomes)
    assert report["tasks"] == 20
    assert report["variants"]["baseline"]["accuracy"] == 0.5
    assert report["variants"]["labels=numbers"]["diff_vs_baseline"] == pytest.approx(-0.2)
    assert report["spread"] == pytest.approx(0.2)
    assert [f["task_id"] for f in report["flips"]] == ["t6", "t7", "t8", "t9"]
    assert report["flips"][0]["outcomes"] == {
        "baseline": True,
        "labels=numbers": False,
        "shuffle=1": True,
    }
    assert report["flip_rate"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        robustness_report({"x": {}})


def test_select_suite():
    assert [p.name for p in select_suite(["all"], True)] == [p.name for p in default_suite(True)]
    assert [p.name for p in select_suite(["shuffle=1"], True)] == ["baseline", "shuffle=1"]
    with pytest.raises(ValueError, match="unknown perturbation"):
        select_suite(["labels=numbers"], multiple_choice=False)
