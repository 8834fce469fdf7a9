"""The task sampler has one owner thread: with an asynchronous producer, the trainer logs
and checkpoints the snapshots the producer handed over, and never reads the curriculum
the producer is changing."""

from __future__ import annotations

import threading

import coin_env  # noqa: F401  (registers coin-v1)
import pytest
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.training.trainer import Trainer

pytestmark = pytest.mark.slow  # trains tiny-random


def _trainer(tmp_path, lag):
    cfg = load_config(None, tiny_overrides(
        "env.id=coin-v1", "rollout.group_size=4", f"rollout.max_policy_lag={lag}",
        "sampling.max_new_tokens=6", "sampling.temperature=1.0", "optim.lr=1e-3",
        f"run.output_dir={tmp_path}", "curriculum.enabled=true",
    ))  # fmt: skip
    return Trainer(cfg, tmp_path / f"lag{lag}")


def _record_callers(trainer: Trainer) -> list[tuple[str, str, bool]]:
    """Every call into the curriculum as (method, calling thread, source started)."""
    calls: list[tuple[str, str, bool]] = []
    curriculum = trainer.experience.curriculum
    for name in ("draw", "observe", "metrics", "state_dict", "load_state_dict"):
        method = getattr(curriculum, name)

        def recorded(*args, _name=name, _method=method, **kwargs):
            started = trainer.experience.source is not None
            calls.append((_name, threading.current_thread().name, started))
            return _method(*args, **kwargs)

        setattr(curriculum, name, recorded)
    return calls


def test_under_async_rollouts_only_the_producer_touches_the_curriculum(tmp_path):
    """Steps and a checkpoint while the producer runs: every call into the curriculum
    after the source started comes from the producer thread, so no read in the trainer
    can meet a half-done `observe` (the trainer used to read the metrics itself)."""
    trainer = _trainer(tmp_path, lag=1)
    calls = _record_callers(trainer)
    try:
        metrics = [trainer.step() for _ in range(2)]
        trainer.save()
        producer = trainer.experience.source._thread.name
    finally:
        trainer.close()
    after_start = {(name, thread) for name, thread, started in calls if started}
    assert {thread for _, thread in after_start} == {producer}, sorted(after_start)
    assert {"draw", "observe", "metrics", "state_dict"} <= {name for name, _ in after_start}
    assert metrics[-1]["curriculum/observed"] > 0  # the producer's snapshot was logged


def test_sync_rollouts_log_the_curriculum_after_the_step_observed(tmp_path):
    trainer = _trainer(tmp_path, lag=0)
    try:
        metrics = trainer.step()
        expected = trainer.experience.curriculum.metrics()  # no other thread: safe to read here
    finally:
        trainer.close()
    assert {k: v for k, v in metrics.items() if k.startswith("curriculum/")} == expected
    assert expected["curriculum/observed"] > 0


@pytest.mark.parametrize("steps", [1, 2])
def test_async_checkpoint_holds_the_observations_of_every_trained_batch(tmp_path, steps):
    """The draw state a checkpoint saves includes the curriculum's record of the batches
    trained so far: the producer drew the next batch with that record, so a resumed run
    must have it to draw the same batch again (the state used to be taken before the
    batch was observed, leaving out the last trained batch)."""
    trainer = _trainer(tmp_path, lag=1)
    try:
        metrics = [trainer.step() for _ in range(steps)]
        state = trainer.experience.source.checkpoint_state()
        rows = trainer.ledger._db.execute(
            "SELECT DISTINCT task_id FROM rollouts WHERE round < ?", (100 + steps,)
        ).fetchall()
    finally:
        trainer.close()
    assert state["next_batch"] == steps
    history = state["curriculum"]["history"]
    assert set(history) == {t for (t,) in rows}  # every task of the batches trained
    assert sum(len(h) for h in history.values()) == 2 * steps  # one group per task drawn
    assert metrics[-1]["curriculum/observed"] == len(history)
