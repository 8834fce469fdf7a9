"""The failure budget: a grader that raises on every sample stops `rldojo train` after
the first step (exit 1, one line naming the error and the counts, summary.json
`stopped: failures`); one that fails on most samples stops when the window is full; a
run whose failures stay under the budget trains to the end."""

from __future__ import annotations

import asyncio
import json
import traceback

import pytest
from tiny_config import tiny_overrides
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.function_reward import rows_to_tasks
from rldojo.envs.registry import register
from rldojo.envs.reward_functions import FunctionGrader
from rldojo.training.failure_budget import FailureBudget
from rldojo.training.stops import GradeFailure
from rldojo.types import Rollout, Score, Task


class _Env(SingleTurnEnv):
    """A few prompts; `grade` decides per sample whether the grader raises."""

    env_id = "fail-v1"
    fails = staticmethod(lambda rollout: True)

    def tasks(self, split="train", *, seed=0, n=None):
        return [Task(id=f"f/{split}/{i}", prompt=f"item {i}", env=self.env_id) for i in range(8)]

    def default_grader(self):
        return _Grader(type(self).fails)


class _Grader:
    name = "boom"

    def __init__(self, fails):
        self.fails = fails

    async def grade(self, rollout, task):
        if self.fails(rollout):
            return 1 / 0  # ZeroDivisionError, as a broken user grader would
        return Score(value=float(sum(rollout.completion_ids) % 2))


class AlwaysEnv(_Env):
    env_id = "fail-always-v1"


class MostlyEnv(_Env):
    """Three samples of every four fail: 75%, over the default 50% budget."""

    env_id = "fail-mostly-v1"
    fails = staticmethod(lambda rollout: rollout.sample_index % 4 != 0)


class SometimesEnv(_Env):
    """One sample of every four fails: 25%, under the budget."""

    env_id = "fail-sometimes-v1"
    fails = staticmethod(lambda rollout: rollout.sample_index % 4 == 0)


class AnsweredEnv(_Env):
    """Tasks with reference answers, a grader that raises on everything: the preflight
    grades the answers and stops before anything is generated."""

    env_id = "fail-answered-v1"

    def tasks(self, split="train", *, seed=0, n=None):
        return [Task(id=f"a/{split}/{i}", prompt=f"What is {i} + 1?", answer=str(i + 1),
                     env=self.env_id) for i in range(12)]  # fmt: skip


for _cls in (AlwaysEnv, MostlyEnv, SometimesEnv, AnsweredEnv):
    register(_cls.env_id, _cls, overwrite=True)

TINY = tiny_overrides("rollout.group_size=4", "run.report_to=[]", "run.threads=1",
                      "run.steps=4", "run.checkpoint_every=1")  # fmt: skip


def _train(tmp_path, env_id, *more):
    sets = [f"env.id={env_id}", f"run.output_dir={tmp_path}", "run.name=r", *TINY, *more]
    return CliRunner().invoke(app, ["train", *[a for s in sets for a in ("--set", s)]])


def _summary(tmp_path):
    return json.loads((tmp_path / "r" / "summary.json").read_text())


@pytest.mark.slow  # trains tiny-random
def test_a_grader_raising_on_every_sample_stops_after_the_first_step(tmp_path):
    result = _train(tmp_path, "fail-always-v1")
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert "grader error in 8/8 samples of step 1" in line
    assert "ZeroDivisionError: division by zero" in line
    assert "every sample of the first step failed" in line
    summary = _summary(tmp_path)
    assert summary["stopped"] == "failures" and summary["steps"] == 1
    assert summary["statuses"] == {"ok/error": 8}
    assert not (tmp_path / "r" / "checkpoints").exists()  # nothing trained to keep


@pytest.mark.slow  # trains tiny-random
def test_the_grader_preflight_stops_on_reference_answers_before_generating(tmp_path):
    result = _train(tmp_path, "fail-answered-v1")
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert "grader preflight: grader error in 8/8 reference answers" in line
    assert "ZeroDivisionError" in line
    summary = _summary(tmp_path)
    assert summary["stopped"] == "failures" and summary["steps"] == 0
    assert summary["rollouts"] == 0  # nothing was generated


@pytest.mark.slow  # trains tiny-random
def test_answers_the_grader_can_score_pass_the_preflight(tmp_path):
    """Reference answers scored 0 are not failures: only grades that could not be made."""
    AnsweredEnv.fails = staticmethod(lambda rollout: bool(rollout.completion_ids))
    try:  # the preflight's rollouts carry no tokens: scored; the policy's all raise
        result = _train(tmp_path, "fail-answered-v1")
    finally:
        AnsweredEnv.fails = _Env.fails
    assert result.exit_code == 1, result.output
    assert "grader error in 8/8 samples of step 1" in result.output  # the first-step rule


@pytest.mark.slow  # trains tiny-random
def test_mostly_failing_samples_stop_the_run_when_the_window_is_full(tmp_path):
    result = _train(tmp_path, "fail-mostly-v1")
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert "grader error in 12/16 samples of steps 1-2" in line
    assert "over run.max_failure_rate = 0.5" in line
    assert _summary(tmp_path)["stopped"] == "failures"
    assert _summary(tmp_path)["steps"] == 2
    # the checkpoints before the stop are kept; the step that spent the budget saves none
    assert [p.name for p in (tmp_path / "r" / "checkpoints").iterdir()] == ["step_000001"]


@pytest.mark.slow  # trains tiny-random
def test_failures_under_the_budget_train_to_the_end(tmp_path):
    result = _train(tmp_path, "fail-sometimes-v1")
    assert result.exit_code == 0, result.output
    summary = _summary(tmp_path)
    assert summary["stopped"] == "steps" and summary["steps"] == 4
    assert summary["statuses"]["ok/error"] == 8  # 2 of 8 a step, excluded and counted


@pytest.mark.slow  # trains tiny-random
def test_a_budget_of_one_never_stops(tmp_path):
    result = _train(tmp_path, "fail-always-v1", "run.steps=2", "run.max_failure_rate=1")
    assert result.exit_code == 0, result.output
    assert _summary(tmp_path)["stopped"] == "steps"


def _sample(i: int, status: str = "ok", grade: str = "ok"):
    rollout = Rollout(
        task_id="t",
        env="e",
        messages=[],
        completion="",
        status=status,
        error="env crashed" if status != "ok" else "",
    )  # type: ignore[arg-type]
    score = Score(value=1.0) if grade == "ok" else Score.failed(grade, f"why {i}")  # type: ignore[arg-type]
    return rollout, score


def _observe(budget, step, samples):
    return budget.observe(step, [r for r, _ in samples], [s for _, s in samples])


def test_budget_counts_by_kind_and_names_the_most_common_first_error():
    budget = FailureBudget(0.5, 2)
    ok = [_sample(i) for i in range(4)]
    assert _observe(budget, 1, ok) is None  # a first step with no failure
    bad = [_sample(0, "timeout"), *[_sample(i, grade="error") for i in range(1, 4)]]
    assert _observe(budget, 2, bad) is None  # 4 of 8: not over half
    stop = _observe(budget, 3, bad)  # the window is steps 2-3: 8 of 8
    assert stop is not None
    assert stop.counts == {"grader error": 6, "episode timeout": 2}
    assert stop.steps == (2, 3) and stop.total == 8 and stop.first_error == "why 1"
    assert str(stop).startswith("8/8 samples of steps 2-3 failed (grader error 6, episode "
                                "timeout 2): why 1")  # fmt: skip


@pytest.mark.parametrize("status", ["truncated"])
def test_a_truncated_but_graded_episode_is_not_a_failure(status):
    budget = FailureBudget(0.5, 1)
    assert _observe(budget, 1, [_sample(0, status)] * 4) is None


def bad_reward(prompt, completion):
    return {"a": 1}[completion]  # a KeyError in the user's own frame


def test_a_failing_reward_is_the_stops_cause_with_its_traceback():
    """The exception a reward function raised stays readable: its traceback is in the
    failed grade's provenance (the ledger keeps it) and is the `__cause__` of the stop,
    which `rldojo --debug` prints."""
    (task,) = rows_to_tasks([{"prompt": "p"}])
    rollout = Rollout(task_id=task.id, env="x", messages=[], completion="c")
    score = asyncio.run(FunctionGrader(bad_reward).grade(rollout, task))
    assert (score.status, score.explanation) == ("error", "KeyError: 'c'")
    kept = score.provenance["traceback"]
    assert kept.startswith("Traceback (most recent call last):")
    assert ", in bad_reward\n" in kept and kept.rstrip().endswith("KeyError: 'c'")
    assert "reward_functions.py" not in kept  # from the user's frame on
    stop = FailureBudget(0.5, 1).observe(1, [rollout], [score])
    assert stop is not None and isinstance(stop.__cause__, GradeFailure)
    shown = "".join(traceback.format_exception(stop))  # what --debug prints
    assert ", in bad_reward" in shown and "direct cause of the following exception" in shown
    ok = FailureBudget(0.5, 1).observe(1, *zip(*[_sample(0, grade="error")], strict=True))
    assert ok is not None and ok.__cause__ is None  # a failure without a traceback
