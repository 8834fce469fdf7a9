"""Two "nodes" on one machine: two torchrun launchers (`--nnodes 2`, one rank each) meet at
a localhost rendezvous and train GRPO as one run; when one launcher dies the other ends
(no hang), and `--resume` with two launchers again finishes the run with no rollout lost
or taken twice.

The launcher dies deterministically: its rank (the observer of `tests/rank_observer.py`
on `clipped_step`) SIGKILLs its own launcher, then itself, in the 2nd step's update, after
step 1's checkpoint and step 2's rollouts are committed.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rank_observer import CHILD, child_env

from rldojo.store.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # two launchers, two processes with the model

SETS = ["model.name=tiny-random", "model.autocast_bf16=false", "env.id=coin_env:CoinEnv",
        "run.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.dynamic_sampling=false", "sampling.max_new_tokens=4", "eval.tasks=0",
        "run.report_to=[]", "run.threads=1", "run.checkpoint_every=1",
        "run.dist_timeout_s=60"]  # fmt: skip

KILL_LAUNCHER = CHILD.replace(
    "        os.kill(os.getpid(), signal.SIGKILL)",
    "        os.kill(os.getppid(), signal.SIGKILL)  # the launcher, then this rank\n"
    "        os.kill(os.getpid(), signal.SIGKILL)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launchers(tmp: Path, label: str, args: list[str], **env: str) -> list[tuple[int, str]]:
    """Two `torchrun --nnodes 2 --nproc-per-node 1` launchers at one rendezvous, run to
    their end (bounded); each one's exit code and output (in files, not pipes: a full
    pipe would stall its rank)."""
    script = tmp / "child.py"
    script.write_text(KILL_LAUNCHER)
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", label,
            "--max-restarts", "0", str(script), "rldojo.training.update", *args]  # fmt: skip
    logs = [tmp / f"{label}-{i}.log" for i in range(2)]
    procs = []
    for log in logs:
        with log.open("w") as out:
            procs.append(subprocess.Popen(base, stdout=out, stderr=subprocess.STDOUT,
                                          env=child_env(**env)))  # fmt: skip
    return [(p.wait(timeout=600), log.read_text()) for p, log in zip(procs, logs, strict=True)]


def test_two_launchers_train_as_one_run_and_resume_after_one_dies(tmp_path):
    run, stamp = tmp_path / "run", tmp_path / "killed_at"
    args = ["train", *[a for s in SETS for a in ("--set", s)],
            "--set", f"run.output_dir={run.parent}", "--set", f"run.name={run.name}"]  # fmt: skip
    # Call 2 is step 2's update (one mini-batch a step); rank 1 takes its launcher down.
    first = _launchers(tmp_path, "first", args, KILL_AT="2", KILL_RANK="1",
                       KILLED_AT=str(stamp))  # fmt: skip
    ended = time.time()
    assert all(code != 0 for code, _ in first), first
    assert ended - float(stamp.read_text()) < 90  # the surviving launcher ended by itself
    assert latest_checkpoint(run / "checkpoints").name == "step_000001"
    resumed = _launchers(tmp_path, "resumed", ["train", "--resume", str(run)])
    assert all(code == 0 for code, _ in resumed), [t[-3000:] for _, t in resumed]
    said = "".join(t for _, t in resumed)
    assert "reused 8 rollouts from the ledger" in said  # step 2's, sampled before the kill
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped"] == "steps"
    assert summary["rollouts"] == 16  # 2 steps x 2 prompts x 4 samples: 0 lost, 0 twice
    with sqlite3.connect(run / "ledger.sqlite") as db:
        keys = db.execute("SELECT step, task_id, sample_index FROM rollouts").fetchall()
    assert len(keys) == len(set(keys)) == 16
