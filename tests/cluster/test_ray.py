"""The same short training run through a local Ray instance: actors, weights, replacement."""

from __future__ import annotations

import os

import pytest
from tiny_config import tiny_overrides

pytestmark = pytest.mark.slow  # a local Ray instance, training tiny-random

ray = pytest.importorskip("ray")

from rldojo.config import load_config  # noqa: E402
from rldojo.training.trainer import Trainer  # noqa: E402

OVERRIDES = tiny_overrides("model.generation_dtype=float32", "run.cluster=ray", "rollout.workers=2")


def _kill_and_wait(actor) -> None:
    """Kill `actor` and wait until it is gone (`ray.kill` only asks for it)."""
    import time

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.05)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_training_through_ray_actors(tmp_path):
    trainer = Trainer(load_config(None, [*OVERRIDES, f"run.output_dir={tmp_path}"]), tmp_path / "r")
    try:
        worker_pids = set(trainer.experience.ray_pool.pids())
        metrics = [trainer.step() for _ in range(2)]
        rows = trainer.ledger.count()
        # Rollouts really came from the actor processes, not the trainer's.
        rollouts = trainer.experience.rollout_source().collect(trainer.step_num, 0).rollouts
    finally:
        trainer.close()
    assert rows == 2 * 4
    assert all(m["rollout/samples"] == 4 for m in metrics)
    pids = {r.info["worker_pid"] for r in rollouts}
    assert pids <= worker_pids and os.getpid() not in pids
    assert len(pids) == 2  # groups spread over both workers


def test_dead_worker_is_replaced_and_work_redispatched(tmp_path):
    trainer = Trainer(load_config(None, [*OVERRIDES, f"run.output_dir={tmp_path}"]), tmp_path / "d")
    try:
        pool = trainer.experience.ray_pool
        _kill_and_wait(pool.actors[0])  # a worker dies between steps
        metrics = trainer.step()
        statuses = trainer.ledger.status_counts()
    finally:
        trainer.close()
    assert pool.replaced >= 1
    assert metrics["rollout/samples"] == 4
    assert statuses == {"ok/ok": 4}  # the lost share was re-run, nothing failed or missing


def test_async_pipeline_generates_on_ray_actors(tmp_path):
    """Lag 1 with Ray: the producer thread sends rounds to the actors; the trainer
    publishes each new version after its optimizer step, and the actors generate with it."""
    # A graded similarity to the question gives two random samples different rewards, so
    # every group carries signal and every step updates (arith's would all be flat).
    similar = (
        'grader.spec={type="text_similarity", name="sim", evaluation_metric='
        '"fuzzy_match", input="{{sample.output_text}}", reference="{{item.prompt}}"}'
    )
    overrides = [*OVERRIDES, "rollout.max_policy_lag=1", f"run.output_dir={tmp_path}", similar]
    trainer = Trainer(load_config(None, overrides), tmp_path / "a")
    try:
        worker_pids = set(trainer.experience.ray_pool.pids())
        metrics = [trainer.step() for _ in range(3)]
        rows = [r for _, r, _ in trainer.ledger.find_round(None, 100)]  # producer batch 0
        published = trainer.experience.ray_pool._published[0]
    finally:
        trainer.close()
    assert all(m["rollout/samples"] == 4 for m in metrics)
    assert all(m["rollout/policy_lag"] <= 1 for m in metrics)
    assert all("train/skipped" not in m for m in metrics)
    assert published == 3  # one snapshot per optimizer step
    pids = {r.info["worker_pid"] for r in rows}
    assert pids and pids <= worker_pids and os.getpid() not in pids


def test_worker_killed_mid_rollout_is_replaced_and_its_share_rerun(tmp_path):
    """A Ray worker dies while its share is in flight (not between steps): the pool
    replaces it, re-sends the share, and the step completes with every sample graded."""
    import threading
    import time

    overrides = [*OVERRIDES, "sampling.max_new_tokens=24", f"run.output_dir={tmp_path}"]
    trainer = Trainer(load_config(None, overrides), tmp_path / "m")
    # Weights that never arrive (a task no node can run): actor 0 fetches them for its
    # first share, so that share cannot finish before the kill, however fast it would run.
    never = ray.remote(resources={"rldojo-test-never": 1})(lambda: None).remote()
    try:
        pool = trainer.experience.ray_pool
        pool.pids()  # both actors up
        victim = pool.actors[0]
        original = pool._send
        killed = threading.Event()

        def send_then_kill(w, share, sampling, published):
            if w == 0 and not killed.is_set():  # the first share to actor 0, once sent
                ref = original(w, share, sampling, (published[0] - 1, [never]))
                killed.set()
                _kill_and_wait(victim)
                return ref
            return original(w, share, sampling, published)

        pool._send = send_then_kill
        started = time.monotonic()
        metrics = trainer.step()
        statuses = trainer.ledger.status_counts()
    finally:
        ray.cancel(never, force=True)
        trainer.close()
    assert killed.is_set() and pool.replaced >= 1
    # Found dead, not waited on until the pool's 600 s timeout.
    assert time.monotonic() - started < 300
    assert metrics["rollout/samples"] == 4
    assert statuses == {"ok/ok": 4}
