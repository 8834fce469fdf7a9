"""Multi-environment batches: weighted, deterministic, resumable draws; per-env graders."""

from __future__ import annotations

import asyncio
import json

import pytest
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.rollout.mixture import EnvMixture
from rldojo.training.trainer import Trainer
from rldojo.types import Rollout


def _math_file(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"problem": f"What is {i} squared?", "answer": str(i * i)} for i in range(2, 60)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _mixture(tmp_path, seed=0):
    entries = [("arith-v1", {}, 0.7), ("math-v1", {"path": str(_math_file(tmp_path))}, 0.3)]
    return EnvMixture(entries, seed=seed, train_n=50, test_n=10)


def test_draws_follow_weights_and_are_deterministic(tmp_path):
    a, b = _mixture(tmp_path), _mixture(tmp_path)
    draws = a.draw(400)
    assert [t.id for t in draws] == [t.id for t in b.draw(400)]
    share = sum(t.env == "math-v1" for t in draws) / len(draws)
    assert 0.2 < share < 0.4
    assert {t.env for t in a.test_tasks} == {"arith-v1", "math-v1"}


def test_state_round_trip_continues_the_same_order(tmp_path):
    a = _mixture(tmp_path)
    a.draw(37)
    state = a.state_dict()
    rest = [t.id for t in a.draw(80)]  # crosses an epoch boundary of math-v1's 50 tasks
    b = _mixture(tmp_path)
    b.load_state_dict(state)
    assert [t.id for t in b.draw(80)] == rest


def test_grader_routes_by_environment(tmp_path):
    mix = _mixture(tmp_path)
    grader = mix.grader()
    arith = mix.slots["arith-v1"].train_tasks[0]
    math = mix.slots["math-v1"].train_tasks[0]
    good_math = Rollout(math.id, "math-v1", [], f"Answer: {math.answer}")
    score = asyncio.run(grader.grade(good_math, math))
    assert score.value == 1.0
    wrong = Rollout(arith.id, "arith-v1", [], "Answer: -1")
    assert asyncio.run(grader.grade(wrong, arith)).value == 0.0
    asyncio.run(grader.close())


@pytest.mark.slow  # trains tiny-random
def test_trainer_step_reports_each_environment(tmp_path):
    path = _math_file(tmp_path)
    mix = f'[{{id="arith-v1"}}, {{id="math-v1", kwargs={{path="{path}"}}}}]'
    cfg = load_config(None, tiny_overrides(
        "rollout.prompts_per_step=6", f"run.output_dir={tmp_path}", f"env.mix={mix}"
    ))  # fmt: skip
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        metrics = trainer.step()
    finally:
        trainer.close()
    envs = {k.split("/")[1] for k in metrics if k.startswith("reward/") and k.endswith("/mean")}
    assert {"arith-v1", "math-v1"} <= envs


@pytest.mark.slow  # trains tiny-random
def test_curriculum_retires_saturated_tasks_across_resume(tmp_path):
    overrides = tiny_overrides(
        f"run.output_dir={tmp_path}", "curriculum.enabled=true", "curriculum.window=1",
        "curriculum.mode=retire", "env.train_tasks=20",
    )  # fmt: skip
    trainer = Trainer(load_config(None, overrides), tmp_path / "c")
    try:
        metrics = trainer.step()
        seen = {r["task_id"] for r in trainer.ledger.samples(0, limit=100)}
        state = trainer.experience.curriculum.state_dict()
        trainer.save()
    finally:
        trainer.close()
    # A random model never writes "Answer: N": its groups are all-wrong, so they retire.
    assert any(k.startswith("curriculum/") for k in metrics)
    assert len(seen) == 2
    resumed = Trainer(load_config(None, overrides), tmp_path / "c", resume=True)
    try:
        assert resumed.experience.curriculum.state_dict() == state
        drawn = {t.id for t in resumed.experience.tasks.draw(18)}
        assert not seen & drawn  # retired tasks are not drawn again
    finally:
        resumed.close()
