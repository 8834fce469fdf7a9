"""Asynchronous rollouts: bounded policy lag, stale-sample handling, failures surface."""

from __future__ import annotations

import time

import coin_env  # noqa: F401  (registers coin-v1)
import pytest
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.training.trainer import Trainer

pytestmark = pytest.mark.slow  # trains tiny-random


def _trainer(tmp_path, lag, *extra):
    cfg = load_config(None, tiny_overrides(
        "env.id=coin-v1", "rollout.group_size=4", f"rollout.max_policy_lag={lag}",
        "sampling.max_new_tokens=6", "sampling.temperature=1.0", "optim.lr=1e-3",
        f"run.output_dir={tmp_path}", *extra,
    ))  # fmt: skip
    return Trainer(cfg, tmp_path / f"lag{lag}")


def _overlapping(trainer: Trainer) -> Trainer:
    """Each weight update waits until the producer has finished the next batch, so that
    batch is generated during the step, with the weights before its update (policy lag 1
    when trained, after the first step), however the threads are scheduled. A pipeline
    that did not generate while training would never finish it (the wait fails)."""
    update = trainer.policy.update_weights

    def update_after_the_next_batch(*args, **kwargs):
        deadline = time.monotonic() + 120
        while trainer.experience.source is None or trainer.experience.source._queue.qsize() < 1:
            assert time.monotonic() < deadline, "no batch was generated during the step"
            time.sleep(0.01)
        return update(*args, **kwargs)

    trainer.policy.update_weights = update_after_the_next_batch
    return trainer


def _rounds(ledger) -> set[int]:
    """The ledger rounds committed so far (read on the test's own connection)."""
    return {r for (r,) in ledger._db.execute("SELECT DISTINCT round FROM rollouts")}


def test_async_steps_stay_within_the_lag_bound(tmp_path):
    trainer = _overlapping(_trainer(tmp_path, lag=1))
    try:
        metrics = [trainer.step() for _ in range(4)]
        rows, trained = trainer.ledger.count(), trainer.ledger.count(trained=True)
    finally:
        trainer.close()
    lags = [m["rollout/policy_lag"] for m in metrics]
    assert all(0 <= lag <= 1 for lag in lags)
    assert max(lags) == 1  # generation really overlapped training
    assert trainer.policy_updates == sum(1 for m in metrics if "train/skipped" not in m)
    assert rows >= 4 * 8  # the producer may already have committed the next batch
    assert trained == sum(m.get("train/sequences", 0) for m in metrics)


def test_stale_samples_use_the_behaviour_ratio(tmp_path):
    trainer = _overlapping(_trainer(tmp_path, lag=1))
    try:
        metrics = [trainer.step() for _ in range(3)]
    finally:
        trainer.close()
    for m in metrics:
        if m["rollout/policy_lag"] == 1 and "loss/ratio_mean" in m:
            # Ratio against an older policy: not identically 1 as on-policy rows are.
            assert m["loss/ratio_mean"] != pytest.approx(1.0, abs=1e-7)
            break
    else:
        pytest.fail("no stale step was trained")


def test_producer_failure_is_raised_not_hung(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, lag=1)

    def broken(n):
        raise OSError("task store unavailable")

    monkeypatch.setattr(trainer.experience.tasks, "draw", broken)
    try:
        with pytest.raises(RuntimeError, match="rollout producer failed"):
            trainer.step()
    finally:
        trainer.close()


def test_evaluations_during_async_training_share_the_grader_pool(tmp_path):
    """`eval.every` with lag 1: the main thread evaluates while the rollout thread grades,
    both through arith's math-verify worker pool; neither hangs nor errors."""
    from rldojo.training.loop import run_training

    cfg = load_config(None, tiny_overrides(
        "env.id=arith-v1", "rollout.group_size=4", "rollout.max_policy_lag=1",
        "sampling.max_new_tokens=6", "eval.tasks=6", "eval.every=1", "run.steps=3",
        f"run.output_dir={tmp_path}", "run.name=ev",
    ))  # fmt: skip
    summary = run_training(cfg)
    assert summary["statuses"] == {"ok/ok": summary["rollouts"]}
    evals = summary["evals"]
    assert set(evals) == {"before", "step_1", "step_2", "after"}  # step 3's is "after"
    assert [e["statuses"] for e in evals.values()] == [{"ok": 6}] * 4


def test_async_resume_redraws_untrained_batches_and_reuses_committed_ones(tmp_path):
    """A crash after the producer committed batches the trainer had not trained: the
    resumed run draws the same batches again (data order continues), reuses the committed
    ones instead of regenerating them, and nothing is committed or trained twice."""
    first = _trainer(tmp_path, lag=1)
    try:
        for _ in range(2):
            first.step()
        first.save()  # checkpoint after step 2: batches 0 and 1 consumed
        first.step()  # step 3 trains batch 2; the producer commits batch 3 meanwhile
        # Taking batch 2 freed the lag bound, so the producer will commit batch 3 (round
        # 103) and then wait for the trainer: wait for that instead of racing `close`.
        deadline = time.monotonic() + 120
        while not {100, 101, 102, 103} <= (ahead := _rounds(first.ledger)):
            assert time.monotonic() < deadline, f"batch 3 never committed: rounds {ahead}"
            time.sleep(0.05)
    finally:
        first.close()  # the "crash": no checkpoint after step 3
    assert ahead == {100, 101, 102, 103}  # batch 4 waits for the lag bound: never started
    cfg = first.config
    second = Trainer(cfg, tmp_path / "lag1", resume=True)
    try:
        assert second.step_num == 2 and second.experience.async_next_batch == 2
        metrics = [second.step() for _ in range(2)]
        rows = second.ledger._db.execute(
            "SELECT round, task_id, sample_index, trained FROM rollouts WHERE round >= 100"
        ).fetchall()
    finally:
        second.close()
    assert metrics[0]["rollout/reused"] == 8  # batch 2 came from the ledger, not the model
    assert metrics[1]["rollout/reused"] == 8  # so did batch 3, made ahead before the crash
    keys = [(r, t, k) for r, t, k, _ in rows]
    assert len(keys) == len(set(keys))  # no batch committed twice
    # Per round, the step that trained it (0: a flat group, never trained).
    trained = {r: {tr for rr, _, _, tr in rows if rr == r and tr} for r in {r for r, *_ in rows}}
    assert trained[100] == {1} and trained[101] == {2}  # from before the checkpoint
    assert trained[102] == {3} and trained[103] == {4}  # redone after the resume, once


@pytest.mark.parametrize("lag", [0, 1])
def test_oversampling_draws_more_and_trains_prompts_per_step_groups(tmp_path, lag):
    trainer = _trainer(tmp_path, lag, "rollout.oversample=2.0")
    try:
        metrics = trainer.step()
        rows = trainer.ledger._db.execute("SELECT trained FROM rollouts").fetchall()
    finally:
        trainer.close()
    assert len(rows) >= 4 * 4  # 2 prompts x 2.0 drawn, G = 4 each
    informative = metrics["rollout/groups_informative"]
    assert informative >= 2  # coin rewards: nearly every group varies
    assert metrics["rollout/groups_surplus"] == informative - 2
    assert metrics["train/sequences"] == 2 * 4  # never more than prompts_per_step groups
    assert sum(1 for (t,) in rows if t) == 2 * 4


@pytest.mark.parametrize("lag", [0, 1])
def test_the_curriculum_learns_on_every_source(tmp_path, lag):
    """Every source reports its groups to the task sampler: after 2 steps the curriculum
    has seen tasks, asynchronous producer included (it never did before the seam)."""
    trainer = _trainer(tmp_path, lag, "curriculum.enabled=true")
    try:
        metrics = [trainer.step() for _ in range(2)]
    finally:
        trainer.close()
    assert metrics[-1]["curriculum/observed"] > 0
    assert trainer.experience.tasks.curriculum is trainer.experience.curriculum
