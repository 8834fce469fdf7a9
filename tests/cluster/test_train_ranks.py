"""Two training ranks as Ray actors (`run.train_ranks = 2`, `run.cluster = "ray"`) train as
one process does: the same rollouts in the ledger, the same selected positions, the same
weights after the step (to float noise: FSDP2 sums the gradients in another order).

One local Ray instance (2 CPUs: a bundle each for the two ranks; the rollout workers take
none) serves both runs. The one-process run trains in this process, with its rollout
worker on Ray as well, so the two runs differ only in where the training ranks live.
`tiny-random` in fp32, deterministic mode, one thread per rank, `coin-v1`
(tests/coin_env.py, importable by the actors through the job's `PYTHONPATH`).
"""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

ray = pytest.importorskip("ray")

from rldojo.cluster.train_ranks import RankError, run_on_ranks  # noqa: E402
from rldojo.config import ConfigError, load_config  # noqa: E402
from rldojo.store.checkpoint import latest_checkpoint  # noqa: E402
from rldojo.training.loop import run_training  # noqa: E402

SETS = ["model.name=tiny-random", "model.autocast_bf16=false", "model.generation_dtype=float32",
        "env.id=coin_env:CoinEnv", "run.steps=1", "rollout.prompts_per_step=3",
        "rollout.group_size=4", "rollout.dynamic_sampling=false", "sampling.max_new_tokens=6",
        "sampling.temperature=1.0", "loss.rho=0.2", "optim.mini_batches=2",
        "optim.micro_batch_size=2", "optim.lr=1e-3", "optim.warmup_steps=0", "eval.tasks=0",
        "run.report_to=[]", "run.threads=1", "run.deterministic=true", "run.cluster=ray",
        "rollout.workers=1", "rollout.worker_threads=1"]  # fmt: skip


@pytest.fixture(scope="module")
def local_ray():
    tests = str(Path(__file__).resolve().parents[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": tests, "OMP_NUM_THREADS": "1"}})  # fmt: skip
    yield
    ray.shutdown()


@pytest.fixture
def torch_settings():
    """The one-process run sets this process's torch threads and deterministic mode."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def _ledger(run: Path) -> list[tuple]:
    """Every rollout: its step, task, sample, tokens, reward, whether trained, its
    advantage and the positions the mask selected."""
    with sqlite3.connect(run / "ledger.sqlite") as db:
        return db.execute(
            "SELECT step, task_id, sample_index, completion_ids, score_value, trained, "
            "advantage, selected FROM rollouts ORDER BY step, task_id, sample_index"
        ).fetchall()


def _weights(run: Path) -> dict[str, torch.Tensor]:
    newest = latest_checkpoint(run / "checkpoints")
    assert newest is not None
    return load_file(newest / "model.safetensors")


def _world(run: Path) -> int:
    """The world size the newest checkpoint was written on."""
    newest = latest_checkpoint(run / "checkpoints")
    assert newest is not None
    return json.loads((newest / "state.json").read_text())["world_size"]


@pytest.mark.slow  # a local Ray instance, three processes with the model
def test_two_ray_ranks_train_as_one_process(tmp_path, local_ray, torch_settings):
    out = f"run.output_dir={tmp_path}"
    one = run_training(load_config(None, [*SETS, out, "run.name=one"]))
    printed = io.StringIO()
    two = run_training(load_config(None, [*SETS, out, "run.name=two", "run.train_ranks=2"]),
                       console=Console(file=printed, width=120))  # fmt: skip
    assert two["steps"] == one["steps"] == 1 and two["stopped"] == "steps"
    assert two["run_dir"] == str(tmp_path / "two") and two["rollouts"] == 12
    said = printed.getvalue()  # rank 0's console, relayed: its step line and summary
    assert "rldojo train: summary" in said and "steps" in said
    r1, r2 = _ledger(tmp_path / "one"), _ledger(tmp_path / "two")
    assert len(r1) == 3 * 4  # prompts x samples, none twice
    assert any(row[5] and json.loads(row[7]) for row in r1)  # trained, positions selected
    assert [r[:6] + r[7:] for r in r1] == [r[:6] + r[7:] for r in r2]  # same positions
    assert [r[6] is None for r in r1] == [r[6] is None for r in r2]
    trained = [(a[6], b[6]) for a, b in zip(r1, r2, strict=True) if a[6] is not None]
    assert [a for a, _ in trained] == pytest.approx([b for _, b in trained], rel=1e-6)
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert w1.keys() == w2.keys()
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4
    assert _world(tmp_path / "one") == 1 and _world(tmp_path / "two") == 2


@pytest.mark.slow  # a local Ray instance
def test_a_lost_rank_is_named_and_the_others_are_stopped(local_ray):
    """Rank 1's actor dies while rank 0 waits for it (here for ever, as a collective
    without a timeout would): the launcher stops rank 0 and names rank 1."""

    def entry(console=None):
        import os
        import signal
        import threading

        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait()  # rank 1 never comes
        return {}

    with pytest.raises(RankError) as lost:
        run_on_ranks(entry, {}, ranks=2, timeout_s=600, on_loss="; resume with: ...")
    said = str(lost.value)
    assert said.startswith("training rank 1 of 2 was lost (") and "\n" not in said
    assert said.endswith("the other ranks were stopped; resume with: ...")


@pytest.mark.slow  # a local Ray instance
def test_a_rank_that_raises_raises_in_the_launcher(local_ray):
    """An exception a rank raised reaches the caller as itself (its type, its line)."""

    def entry(console=None):
        import os

        if os.environ["RANK"] == "0":
            raise ValueError("rank 0 refused the config")
        return {"rank": 1}

    with pytest.raises(ValueError, match="rank 0 refused the config"):
        run_on_ranks(entry, {}, ranks=2)


@pytest.mark.slow  # a local Ray instance
def test_no_room_for_the_ranks_is_one_line(local_ray):
    """Three one-CPU ranks on a two-CPU instance never fit: refused after the wait."""
    with pytest.raises(RankError, match="no room for 3 training ranks"):
        run_on_ranks(lambda console=None: {}, {}, ranks=3, timeout_s=1)


def test_ranks_as_actors_need_ray():
    """Several ranks without Ray is refused in one line that names the local way."""
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["run.train_ranks=2"])
    assert str(refused.value) == (
        "--set run.train_ranks: 2 ranks as Ray actors need run.cluster = 'ray'; "
        "on this machine use rldojo train --nproc 2 (torchrun) instead"
    )
