"""reasoning-gym-v1 over a weighted mix of datasets: draws, per-dataset grading, and the
one-line error for an unknown dataset. Needs the optional reasoning-gym package."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.registry import EnvKwargsError, make_env
from rldojo.types import Rollout

rg = pytest.importorskip("reasoning_gym")

MIX = {"leg_counting": 1, "basic_arithmetic": 2}


def grade(env, task, text):
    grader = env.default_grader()
    return asyncio.run(grader.grade(Rollout(task.id, env.env_id, [], text), task))


def test_weights_are_respected_over_many_seeds():
    env = make_env("reasoning-gym-v1", datasets=MIX)
    counts: Counter[str] = Counter()
    for seed in range(100):
        counts.update(t.info["dataset"] for t in env.tasks("train", seed=seed, n=30))
    # 3000 draws at p = 1/3: mean 1000, sd ~26; 5 sd either side
    assert set(counts) == set(MIX) and abs(counts["leg_counting"] - 1000) <= 130
    again = env.tasks("train", seed=7, n=30)
    assert [t.id for t in again] == [t.id for t in env.tasks("train", seed=7, n=30)]
    assert len({t.id for t in again}) == 30
    assert {t.prompt for t in again}.isdisjoint(t.prompt for t in env.tasks("test", seed=7, n=30))


def test_each_task_is_graded_by_its_own_datasets_scorer():
    env = make_env("reasoning-gym-v1", datasets=MIX)
    tasks = env.tasks("train", seed=3, n=12)
    assert {t.info["dataset"] for t in tasks} == set(MIX)
    for task in tasks:
        name = task.info["dataset"]
        assert task.id.startswith(f"reasoning-gym-v1/{name}/")
        assert task.info["entry"]["metadata"]["source_dataset"] == name
        scorer = rg.get_score_answer_fn(name)
        for answer in (task.answer, "12", "-3"):
            score = grade(env, task, f"<answer>{answer}</answer>")
            assert score.ok and score.provenance["dataset"] == name
            assert score.value == float(scorer(answer=answer, entry=task.info["entry"]))
        assert grade(env, task, f"<answer>{task.answer}</answer>").value == 1.0


def test_single_dataset_kwarg_still_works():
    env = make_env("reasoning-gym-v1", dataset="basic_arithmetic", config={"max_terms": 2})
    tasks = env.tasks("train", seed=0, n=5)
    assert [t.info["dataset"] for t in tasks] == ["basic_arithmetic"] * 5
    assert tasks[0].id == "reasoning-gym-v1/basic_arithmetic/train/0/0"
    assert make_env("reasoning-gym-v1").tasks("train", n=1)[0].info["dataset"] == "leg_counting"


def test_unknown_dataset_is_one_line_with_a_suggestion():
    with pytest.raises(EnvKwargsError) as info:
        make_env("reasoning-gym-v1", datasets={"leg_counting": 1, "basic_arithmetik": 2})
    assert str(info.value) == (
        "env.kwargs.datasets.basic_arithmetik: reasoning-gym has no dataset "
        "'basic_arithmetik' (did you mean 'basic_arithmetic'?)"
    )
    with pytest.raises(EnvKwargsError, match=r"^env.kwargs.configs.leg_counting.min_animal: "
                       r".*\(did you mean 'min_animals'\?\)"):  # fmt: skip
        make_env("reasoning-gym-v1", datasets=MIX, configs={"leg_counting": {"min_animal": 2}})
    with pytest.raises(EnvKwargsError, match="weight must be a number > 0"):
        make_env("reasoning-gym-v1", datasets={"leg_counting": 0})
    with pytest.raises(EnvKwargsError, match="not both"):
        make_env("reasoning-gym-v1", dataset="leg_counting", datasets=MIX)


def test_the_cli_lists_datasets_and_refuses_an_unknown_one(tmp_path):
    listed = CliRunner().invoke(app, ["envs", "--reasoning-gym"])
    assert listed.exit_code == 0, listed.output
    names = listed.output.split()
    assert names == sorted(rg.factory.DATASETS) and "leg_counting" in names
    out = tmp_path / "d.jsonl"
    kwargs = '{"datasets": {"leg_countin": 1}}'
    args = ["demos", "reasoning-gym-v1", "--from-answers", "--out", str(out)]
    bad = CliRunner().invoke(app, [*args, "--env-kwargs", kwargs])
    assert bad.exit_code == 2 and "did you mean 'leg_counting'?" in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and not out.exists()
