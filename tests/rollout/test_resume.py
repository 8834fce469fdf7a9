"""Durability: resume continues exactly; a SIGKILLed run resumes without loss or repeats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import warm
from safetensors.torch import load_file
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.store.ledger import Ledger
from rldojo.training.loop import run_training
from rldojo.types import Score, Task

pytestmark = pytest.mark.slow  # trains tiny-random; SIGKILLs a subprocess


class ParityEnv(SingleTurnEnv):
    """Reward = parity of the sum of completion token ids: random models get informative groups."""

    env_id = "parity-v1"

    def tasks(self, split="train", *, seed=0, n=None):
        return [
            Task(id=f"p/{split}/{i}", prompt=f"item {i}", env="parity-v1") for i in range(n or 30)
        ]

    def default_grader(self):
        return ParityGrader()


class ParityGrader:
    name = "parity"

    async def grade(self, rollout, task):
        return Score(value=float(sum(rollout.completion_ids) % 2))


register("parity-v1", ParityEnv, overwrite=True)
# A child imports this module: its folder, and tests/ (pytest's `pythonpath`: tiny_config).
_CHILD_PATH = [os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__))]

BASE = tiny_overrides(
    "env.id=parity-v1", "rollout.group_size=4", "sampling.max_new_tokens=6",
    "sampling.temperature=1.0", "optim.lr=1e-3", "run.deterministic=true",
    "run.checkpoint_every=1", drop=["rollout.dynamic_sampling"],
)  # fmt: skip


def _metrics(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in rows]


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    full = load_config(None, [*BASE, "run.steps=3", f"run.output_dir={tmp_path}", "run.name=a"])
    run_training(full)
    part = load_config(None, [*BASE, "run.steps=2", f"run.output_dir={tmp_path}", "run.name=b"])
    run_training(part)
    resumed = load_config(None, [*BASE, "run.steps=3"])
    run_training(resumed, run_dir=tmp_path / "b", resume=True)
    a = load_file(tmp_path / "a" / "checkpoints" / "step_000003" / "model.safetensors")
    b = load_file(tmp_path / "b" / "checkpoints" / "step_000003" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
    assert any(m.get("optim/grad_norm", 0) > 0 for m in _metrics(tmp_path / "a"))


def _kill_after_two_checkpoints(
    run, overrides: list[str], delay_s: float = 0.0
) -> subprocess.Popen[bytes]:
    """Train with `overrides` in a subprocess; SIGKILL it `delay_s` after its second
    checkpoint (two steps durable) and return the reaped process. The run parks before
    its 5th step (it never ends by itself), so the kill lands mid-run however late it
    comes: after step 2, 3 or 4."""
    script = (
        f"import sys, time; sys.path[:0] = {_CHILD_PATH!r}\n"
        "import test_resume  # registers parity-v1\n"
        "from rldojo.config import load_config\n"
        "from rldojo.training.loop import run_training\n"
        "from rldojo.training.trainer import Trainer\n"
        "step = Trainer.step\n"
        "def parked(self):\n"
        "    if self.step_num >= 4:\n"
        "        time.sleep(3600)  # until the test kills this process\n"
        "    return step(self)\n"
        "Trainer.step = parked\n"
        f"run_training(load_config(None, {overrides!r}))\n"
    )
    log = run.parent / f"{run.name}.stderr"
    with log.open("wb") as err:
        proc = warm.Popen(  # forked from a warm interpreter (tests/warm.py)
            [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 300
        while not (run.exists() and len(list((run / "checkpoints").glob("step_*"))) >= 2):
            assert proc.poll() is None, f"the run ended early: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no second checkpoint within 300 s"
            time.sleep(0.05)
        time.sleep(delay_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return proc


def test_sigkill_then_resume_loses_nothing_and_repeats_nothing(tmp_path):
    run = tmp_path / "k"
    overrides = [*BASE, "run.steps=6", f"run.output_dir={tmp_path}", "run.name=k"]
    _kill_after_two_checkpoints(run, overrides)
    ledger = Ledger(run / "ledger.sqlite")
    before = ledger.count()
    ledger.close()
    assert before > 0
    run_training(load_config(None, [*BASE, "run.steps=6"]), run_dir=run, resume=True)
    ledger = Ledger(run / "ledger.sqlite")
    try:
        steps = [m["step"] for m in ledger.step_metrics()]
        assert steps == [1, 2, 3, 4, 5, 6]  # numbering continues, no step twice
        rows = ledger._db.execute(
            "SELECT step, task_id, sample_index, COUNT(*), SUM(trained > 0) FROM rollouts"
            " GROUP BY step, task_id, sample_index"
        ).fetchall()
        trained = [r for r in rows if r[4]]
        # Every (step, task, sample) trained at most once across the crash.
        assert all(r[4] <= 1 for r in rows)
        assert {r[0] for r in trained} == {0, 1, 2, 3, 4, 5}
        assert ledger.count() >= before  # nothing completed before the kill was lost
    finally:
        ledger.close()


def test_ledger_exports_to_parquet(tmp_path):
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from rldojo.cli import app

    cfg = load_config(None, [*BASE, "run.steps=1", f"run.output_dir={tmp_path}", "run.name=x"])
    run_training(cfg)
    out = tmp_path / "l.parquet"
    result = CliRunner().invoke(app, ["ledger", "export", str(tmp_path / "x"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    ledger = Ledger(tmp_path / "x" / "ledger.sqlite")
    n = ledger.count()
    ledger.close()
    assert table.num_rows == n >= 8
    assert {"completion_ids", "policy_mask", "score_value", "score_status"} <= set(
        table.column_names
    )
    result = CliRunner().invoke(app, ["ledger", "stats", str(tmp_path / "x")])
    assert f"rollouts: {n}" in result.output


def test_async_sigkill_then_resume_commits_nothing_twice(tmp_path):
    """Lag 1: `kill -9` mid-run while the producer works ahead, then resume. Steps continue
    once each; no producer batch is committed twice; each batch is trained in one step at
    most; what is left untrained is only what the producer made ahead, or dropped as stale."""
    run = tmp_path / "ak"
    overrides = [*BASE, "rollout.max_policy_lag=1", "rollout.dynamic_sampling=false",
                 "run.steps=6", f"run.output_dir={tmp_path}", "run.name=ak"]  # fmt: skip
    proc = _kill_after_two_checkpoints(run, overrides, delay_s=0.1)  # inside a step
    assert proc.returncode == -signal.SIGKILL and not (run / "summary.json").exists()
    killed_at = len(list((run / "checkpoints").glob("step_*")))
    run_training(load_config(None, overrides), run_dir=run, resume=True)
    ledger = Ledger(run / "ledger.sqlite")
    try:
        metrics = ledger.step_metrics()
        rows = ledger._db.execute(
            "SELECT round, task_id, sample_index, trained FROM rollouts WHERE round >= 100"
        ).fetchall()
    finally:
        ledger.close()
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    keys = [(r, t, k) for r, t, k, _ in rows]
    assert len(keys) == len(set(keys))  # no batch committed twice
    by_round: dict[int, set[int]] = {}  # the steps that trained each batch's rows
    for r, _, _, trained in rows:  # 0: untrained (a flat group is never trained)
        by_round.setdefault(r, set()).update({trained} - {0})
    assert all(len(steps) <= 1 for steps in by_round.values())  # a batch: one step at most
    trained_steps = sorted(next(iter(s)) for s in by_round.values() if s)
    updated = [m["step"] for m in metrics if not m.get("train/skipped")]  # skipped: all flat
    assert len(updated) >= 4 and trained_steps == updated  # one batch per step, each once
    dropped = sum(m.get("rollout/stale_dropped", 0) for m in metrics) // 2  # groups/batch
    untrained = [r for r, s in by_round.items() if not s]
    skipped = len(metrics) - len(updated)
    assert len(untrained) <= 1 + dropped + skipped  # made ahead at the end, stale, or flat
    assert 2 <= killed_at <= 4  # the kill landed mid-run (the run parks before step 5)
