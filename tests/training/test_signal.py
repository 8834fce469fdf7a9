"""A step without learning signal says why: the `signal/` metrics, the graders' `no_answer`
flag, and `SignalWatch`'s one line (on real tiny-random rollouts, and on constructed
metrics for the equal-reward causes)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from tiny_config import tiny_overrides

from rldojo.config import RolloutConfig, load_config
from rldojo.envs.mcq.items import MCFormat, MCItem, MultipleChoiceGrader, mc_task
from rldojo.envs.reasoning_gym.env import ReasoningGymGrader
from rldojo.graders.composite import answer_reward
from rldojo.graders.rules import NO_ANSWER_FLAG, ExactMatchGrader
from rldojo.training.inputs import build_mixture
from rldojo.training.no_signal import (
    NoSignal,
    SignalWatch,
    diagnose,
    expected_answer,
    no_signal_report,
    signal_watch,
)
from rldojo.training.step_metrics import rollout_metrics
from rldojo.training.trainer import Trainer
from rldojo.types import Rollout, Score, Task

TINY = tiny_overrides(
    "model.generation_dtype=float32", "env.id=arith-v1", "sampling.max_new_tokens=6",
    "env.train_tasks=8", "run.steps=1", "run.threads=1",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # `run.threads` sets them for the whole process
    yield
    torch.set_num_threads(threads)


def _grade(grader, completion: str, task: Task) -> Score:
    return asyncio.run(grader.grade(Rollout(task.id, task.env, [], completion), task))


def test_graders_that_extract_an_answer_flag_a_completion_without_one():
    task = Task(id="t", prompt="What is 2 + 3?", answer="5", env="arith-v1")
    for grader in (answer_reward(), ExactMatchGrader()):
        assert NO_ANSWER_FLAG in _grade(grader, "I think it is five", task).flags
        assert NO_ANSWER_FLAG not in _grade(grader, "Answer: 4", task).flags  # wrong, found
    mc = mc_task("m", MCItem("Which is prime?", ("4", "7"), correct=1), MCFormat())
    assert NO_ANSWER_FLAG in _grade(MultipleChoiceGrader(), "hmm", mc).flags
    assert NO_ANSWER_FLAG not in _grade(MultipleChoiceGrader(), "Answer: Z", mc).flags
    rg = Task(id="r", prompt="q", env="reasoning-gym-v1",
              info={"source": ("leg_counting", 0, 1, ()), "entry": {"answer": "4"}})  # fmt: skip
    score = _grade(ReasoningGymGrader(), "I think it is four", rg)
    assert score.ok and NO_ANSWER_FLAG in score.flags
    assert NO_ANSWER_FLAG not in _grade(ReasoningGymGrader(), "The final answer is 4.", rg).flags


def _rollout(truncated: int = 0) -> Rollout:
    info = {"truncated_turns": truncated} if truncated else {}
    return Rollout("t", "arith-v1", [], "x", completion_ids=(1, 2), policy_mask=(True, True),
                   info=info)  # fmt: skip


def test_signal_metrics_count_cut_completions_and_missing_answers():
    rollouts = [_rollout(1), _rollout(2), _rollout(), _rollout()]
    scores = [
        Score(0.0, flags=(NO_ANSWER_FLAG,)),
        Score(0.0, flags=(NO_ANSWER_FLAG,)),
        Score(1.0),
        Score.failed("error", "grader broke"),  # says nothing about the answer
    ]
    m = rollout_metrics(rollouts, scores, [], RolloutConfig())
    assert m["signal/truncated"] == 0.5
    assert m["signal/no_answer"] == pytest.approx(2 / 3)
    empty = rollout_metrics([], [], [], RolloutConfig())
    assert empty["signal/truncated"] == 0.0 and empty["signal/no_answer"] == 0.0


@pytest.mark.slow  # trains tiny-random
def test_a_real_step_without_signal_names_the_token_limit(tmp_path):
    # tiny-random writes garbage: no completion ends within 6 tokens or has an answer, so
    # every reward is -0.5 and no group is informative.
    config = load_config(None, [*TINY, f"run.output_dir={tmp_path}"])
    trainer = Trainer(config, tmp_path / "run")
    try:
        metrics = trainer.step()
        watch = signal_watch(trainer.config, trainer.envs)
    finally:
        trainer.close()
    assert metrics["rollout/groups_informative"] == 0
    assert metrics["signal/truncated"] >= 0.5 and metrics["signal/no_answer"] == 1.0
    line = watch.observe(1, metrics)
    assert line is not None
    assert line.startswith("warning: no learning signal at step 1 (0 of 2 groups")
    assert "of completions hit sampling.max_new_tokens = 6: raise it" in line
    assert "had no extractable answer" in line
    assert watch.expects == "a line 'Answer: <number>'"


@pytest.mark.slow  # trains tiny-random
def test_rldojo_train_prints_the_line_under_the_step_line(tmp_path):
    from typer.testing import CliRunner

    from rldojo.cli import app

    sets = [*TINY, f"run.output_dir={tmp_path}", "run.steps=2", "run.report_to=[]", "run.name=r"]
    result = CliRunner().invoke(app, ["train", *[a for x in sets for a in ("--set", x)]])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("step   1"))
    assert lines[first + 1].startswith("warning: no learning signal at step 1 (0 of 2 groups")
    assert not any("no learning signal at step 2" in x for x in lines)  # unchanged
    # a successful run keeps stderr for warnings and errors: no third-party progress bars
    # (transformers' "Writing model shards" as the checkpoint is saved)
    assert result.stderr == ""
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert [d["cause"] for d in summary["no_signal"]] == ["truncated"]
    assert summary["no_signal"][0]["steps"] == [1, 2]  # said once, recorded for each step


def _no_signal(**values: float) -> dict[str, float]:
    base = {"rollout/groups": 4, "rollout/groups_informative": 0, "rollout/samples": 16,
            "signal/truncated": 0.0, "signal/no_answer": 0.0, "reward/pass_rate": 0.0,
            "reward/mean": 0.0, "reward/std": 0.0}  # fmt: skip
    return base | values


@pytest.mark.parametrize(
    ("values", "cause", "says"),
    [
        ({"signal/truncated": 0.84}, "truncated", "84% of completions hit sampling.max_new_"
         "tokens = 48: raise it"),
        ({"signal/no_answer": 0.91}, "no_answer", "91% had no extractable answer: the env "
         "expects <answer>…</answer>"),
        ({}, "too_hard", "no completion passed (reward +0.00): too hard"),
        ({"reward/mean": -0.4, "reward/std": 0.3}, "too_hard", "no completion passed"),
        ({"reward/pass_rate": 1.0, "reward/mean": 1.0}, "too_easy", "every completion passed"),
        # every sample passed: the token limit is not why, however many were cut
        ({"reward/pass_rate": 1.0, "reward/mean": 1.0, "signal/truncated": 1.0,
          "signal/no_answer": 1.0}, "too_easy", "every completion passed (reward +1.00)"),
        ({"reward/mean": 0.3}, "constant_reward", "every reward was +0.30: the reward does "
         "not vary"),
        ({"reward/pass_rate": 0.5, "reward/mean": 0.5}, "constant_reward",
         "every reward was +0.50"),  # a grader's `correct` passes some, the values are equal
        ({"reward/pass_rate": 0.5, "reward/mean": 0.5, "reward/std": 0.5}, "equal_groups",
         "50% passed, but every group was all-pass"),
        ({"rollout/status_env_error": 12}, "failures", "75% of rollouts or grades failed "
         "(status_env_error 12)"),
    ],
)  # fmt: skip
def test_each_cause_is_named_from_what_was_measured(values, cause, says):
    found = diagnose(_no_signal(**values), 48, "<answer>…</answer>")
    assert found.cause == cause and says in found.text


def test_without_a_known_format_the_advice_stays_general():
    found = diagnose(_no_signal(**{"signal/no_answer": 1.0}), 48, None)
    assert found.text == "100% had no extractable answer: check the answer format it asks for"


def test_the_watch_speaks_on_the_first_step_on_a_new_cause_and_every_n_silent_steps():
    watch = SignalWatch(48, every=3)
    hard, cut = _no_signal(), _no_signal(**{"signal/truncated": 0.9})
    signal = _no_signal(**{"rollout/groups_informative": 2})
    said = [watch.observe(s, m) is not None
            for s, m in enumerate([hard, hard, signal, hard, hard, hard, cut, cut], 1)]  # fmt: skip
    # step 1: first; 2, 4: same cause; 3: signal; 5: third silent step since the report
    # (2, 4, 5); 6: counting again; 7: the cause changed; 8: same cause
    assert said == [True, False, False, False, True, False, True, False]
    assert watch.observe(9, {"reward/mean": 0.0}) is None  # no group counts: nothing to say
    with pytest.raises(ValueError, match="every"):
        SignalWatch(48, every=0)


def test_the_report_groups_the_steps_without_signal_by_cause():
    cut = _no_signal(**{"signal/truncated": 0.9})
    easy = _no_signal(**{"reward/pass_rate": 1.0, "reward/mean": 1.0})
    signal = _no_signal(**{"rollout/groups_informative": 2})
    steps = [{"step": i, **m} for i, m in enumerate([cut, signal, easy, cut, easy], 1)]
    report = no_signal_report([*steps, {"step": 6, "loss": 0.1}], 48)  # 6: no group counts
    assert [(r.cause, r.steps) for r in report] == [("truncated", (1, 4)), ("too_easy", (3, 5))]
    assert report[0].text == diagnose(cut, 48).text
    assert NoSignal.from_dict(report[1].as_dict()) == report[1]  # summary.json round-trips
    assert no_signal_report([steps[1]], 48) == []


def test_the_expected_answer_comes_from_the_environments_unless_a_spec_grades():
    def envs(*sets: str):
        config = load_config(None, ["eval.tasks=1", "env.train_tasks=2", *sets])
        return expected_answer(config, build_mixture(config))

    assert envs("env.id=mcq-v1") == "a line 'Answer: <letter>'"
    assert envs("env.id=mcq-v1", "env.kwargs.labels=numbers") == "a line 'Answer: <number>'"
    assert envs("env.id=tictactoe-v1") is None  # a game: no answer to extract
