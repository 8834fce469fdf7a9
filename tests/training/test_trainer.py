"""End-to-end trainer on `tiny-random`: steps, metrics, ledger, checkpoints, resume."""

from __future__ import annotations

import json

import coin_env  # noqa: F401  (registers coin-v1: groups with signal from a random model)
import pytest
import torch
from safetensors.torch import load_file
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.training.loop import run_training
from rldojo.training.trainer import Trainer
from rldojo.training.update import lr_lambda

pytestmark = pytest.mark.slow  # trains tiny-random

TINY = tiny_overrides(
    "env.id=coin-v1",
    "rollout.group_size=4",
    "sampling.max_new_tokens=8",
    "sampling.temperature=1.0",
    "optim.micro_batch_size=3",
    "optim.lr=1e-3",
    "eval.tasks=4",
    "eval.max_new_tokens=4",
    "env.train_tasks=20",
)


def _config(tmp_path, *extra: str):
    return load_config(None, [*TINY, f"run.output_dir={tmp_path}", *extra])


def _trainer(tmp_path, *extra: str, name: str = "run") -> Trainer:
    return Trainer(_config(tmp_path, *extra), tmp_path / name)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_steps_train_and_log(tmp_path):
    # coin-v1 rewards the parity of the sampled ids: groups carry signal, so both steps
    # make a real update (non-zero gradient, weights moved), trained on informative groups.
    cfg = _config(tmp_path, "run.steps=2", "run.name=two", "run.checkpoint_every=1")
    summary = run_training(cfg)
    run = tmp_path / "two"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "time/step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["rollout/samples"] >= 8
        assert m["time/generate"] > 0
        assert "reward/mean" in m
        assert "train/skipped" not in m and m["rollout/groups_informative"] > 0
        assert m["reward/std"] > 0 and m["optim/grad_norm"] > 0
        assert m["train/sequences"] == 4 * min(2, m["rollout/groups_informative"])
    first = load_file(run / "checkpoints" / "step_000001" / "model.safetensors")
    second = load_file(run / "checkpoints" / "step_000002" / "model.safetensors")
    assert any(not torch.equal(first[k], second[k]) for k in first)
    assert (run / "config.toml").exists()
    assert (run / "tensorboard").is_dir()
    assert (run / "checkpoints" / "step_000002" / "model.safetensors").exists()
    assert summary["steps"] == 2
    assert summary["rollouts"] == sum(m["rollout/samples"] for m in steps)
    assert summary["accuracy_before"] is not None and summary["accuracy_after"] is not None
    evals = [m for m in lines if m["kind"] == "eval"]
    assert all(m["eval/ci_low"] <= m["eval/accuracy"] <= m["eval/ci_high"] for m in evals)
    # the ledger records what each step's mask selected and each trained row's advantage
    import sqlite3

    db = sqlite3.connect(run / "ledger.sqlite")
    rows = db.execute("SELECT trained, advantage, selected, policy_mask FROM rollouts").fetchall()
    for m in steps:
        mine = [r for r in rows if r[0] == m["step"]]
        assert sum(len(json.loads(r[2])) for r in mine) == m["entropy/tokens_selected"]
        for _, advantage, selected, mask in mine:
            assert advantage is not None
            assert all(json.loads(mask)[i] for i in json.loads(selected))  # policy tokens only
    assert all(r[1] is None and r[2] is None for r in rows if r[0] == 0)


def test_step_updates_only_through_selected_tokens(tmp_path):
    trainer = _trainer(tmp_path, "loss.rho=0.2")
    try:
        before = _weights(trainer.model)
        groups = (
            trainer.experience.rollout_source()
            .collect(trainer.step_num, trainer.policy_updates)
            .groups
        )
        # Force signal: give each group's samples distinct rewards regardless of the grader.
        from rldojo.rollout.groups import Group
        from rldojo.types import Score

        forced = [
            Group(
                g.task,
                g.rollouts,
                [Score(value=float(i)) for i in range(len(g.rollouts))],
                g.ledger_ids,
            )
            for g in groups
        ]
        metrics = trainer.train_on(forced)
        after = _weights(trainer.model)
        assert any(not torch.equal(before[k], after[k]) for k in before)
        policy_tokens = metrics["entropy/tokens_policy"]
        assert 0 < metrics["entropy/tokens_selected"] <= policy_tokens
        assert metrics["entropy/tokens_selected"] >= round(0.2 * policy_tokens)
        assert metrics["entropy/forking_tokens"]
        assert metrics["optim/grad_norm"] > 0
        assert trainer.policy.version == 1
    finally:
        trainer.close()


def test_resume_continues_step_and_data_order(tmp_path):
    cfg = _config(tmp_path, "run.steps=1", "run.name=r", "eval.tasks=0")
    run_training(cfg)
    run = tmp_path / "r"
    saved = load_file(run / "checkpoints" / "step_000001" / "model.safetensors")
    resumed = Trainer(_config(tmp_path, "run.steps=2", "eval.tasks=0"), run, resume=True)
    try:
        assert resumed.step_num == 1
        assert resumed.envs.draws == 2
        state = resumed.model.state_dict()
        for key, value in saved.items():
            assert torch.equal(state[key], value), key
        assert resumed.optimizer.state  # AdamW moments restored
        resumed.step()
        assert resumed.step_num == 2
        assert resumed.ledger.count() == 16
    finally:
        resumed.close()


def test_lr_schedule():
    assert lr_lambda(0, warmup=4, total=10, schedule="constant") == pytest.approx(0.25)
    assert lr_lambda(5, warmup=0, total=10, schedule="linear") == pytest.approx(0.5)
    assert lr_lambda(10, warmup=0, total=10, schedule="cosine") == pytest.approx(0.0)
    assert lr_lambda(3, warmup=0, total=10, schedule="constant") == 1.0


def test_kl_to_the_initial_model_is_computed_and_logged(tmp_path):
    from rldojo.rollout.groups import Group
    from rldojo.types import Score

    trainer = _trainer(tmp_path, "loss.kl_coef=0.1")
    try:
        groups = (
            trainer.experience.rollout_source()
            .collect(trainer.step_num, trainer.policy_updates)
            .groups
        )
        forced = [
            Group(g.task, g.rollouts, [Score(value=float(i)) for i in range(len(g.rollouts))],
                  g.ledger_ids)
            for g in groups
        ]  # fmt: skip
        first = trainer.train_on(forced)
        second = trainer.train_on(forced)
    finally:
        trainer.close()
    assert first["loss/kl"] == pytest.approx(0.0, abs=1e-6)  # identical to the reference
    assert second["loss/kl"] > 0.0  # one update later the policy has moved away


def test_trainer_entropy_source_matches_the_sampler(tmp_path):
    from rldojo.training.batch import build_token_batch

    trainer = _trainer(tmp_path, "model.generation_dtype=float32", "loss.entropy_source=trainer")
    try:
        groups = (
            trainer.experience.rollout_source()
            .collect(trainer.step_num, trainer.policy_updates)
            .groups
        )
        rollouts = [r for g in groups for r in g.rollouts]
        batch = build_token_batch(rollouts, trainer.tokenizer.pad_token_id)
        recomputed = trainer.update.entropy(batch)  # [B, T]
    finally:
        trainer.close()
    mask = batch.policy_mask
    assert mask.any()
    assert torch.allclose(recomputed[mask], batch.sampler_entropy[mask], atol=1e-3)


def test_logs_mark_eval_rows_samples_carry_prompt_and_components_and_resume_adds_no_tb_file(
    tmp_path,
):
    cfg = _config(tmp_path, "run.steps=1", "run.name=logs", "env.id=arith-v1")  # components
    run_training(cfg)
    run = tmp_path / "logs"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    kinds = [(r["step"], r["kind"]) for r in records]
    assert kinds == [(0, "eval"), (1, "train"), (1, "eval")]  # before, step 1, after
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:
        assert s["prompt"] and s["prompt"][-1]["role"] == "user"
        assert all(m["role"] != "assistant" for m in s["prompt"])
        assert isinstance(s["components"], dict) and s["components"]
    events = sorted(p.name for p in (run / "tensorboard").iterdir())
    assert len(events) == 1
    run_training(cfg, run_dir=run, resume=True)  # finished: nothing to do, nothing logged
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == events


def test_flat_groups_are_never_trained_even_without_dynamic_sampling(tmp_path):
    """A random model never writes "Answer: N" on arith-v1: every sample scores -0.5, so
    every group is flat. Without refills (dynamic_sampling=false) the step is skipped:
    no optimizer step, no policy version, nothing marked trained (they used to be
    trained with zero advantage, bumping Adam's moments and the version)."""
    trainer = _trainer(tmp_path, "env.id=arith-v1")
    try:
        metrics = trainer.step()
        assert metrics["rollout/groups"] == 2 and metrics["rollout/groups_informative"] == 0
        assert metrics["reward/std"] == 0
        assert metrics["train/skipped"] == 1 and "train/sequences" not in metrics
        assert trainer.policy_updates == 0 and not trainer.optimizer.state
        assert trainer.ledger.count(trained=True) == 0
    finally:
        trainer.close()
