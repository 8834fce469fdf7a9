"""Interrupts: a real SIGINT to a real `rldojo train` stops it after the step in flight
with a checkpoint, one line naming the step and the resume command, exit code 130, and
`--resume` goes on from there; `rldojo sft` the same. The handler's rules (a second
signal, or the first during an evaluation, stops at once) are checked in this process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm

from rldojo.config import load_config
from rldojo.training.interrupts import Interrupts
from rldojo.training.loop import run_training

pytestmark = pytest.mark.slow  # loads tiny-random or starts the CLI

TINY = ["model.name=tiny-random", "model.autocast_bf16=false", "eval.tasks=0",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "sampling.max_new_tokens=4",
        "rollout.dynamic_sampling=false", "run.report_to=[]", "run.threads=1"]  # fmt: skip


def _wait_for(condition, what: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _steps_logged(run: Path, kind: str = "train") -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
    return sum(r.get("kind") == kind for r in lines)


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    # forked from a warm interpreter (tests/warm.py), its signals its own as in any process
    return warm.Popen([sys.executable, "-m", "rldojo.cli", *args], env=env, text=True,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def test_sigint_stops_after_the_step_in_flight_with_a_checkpoint_and_resumes(tmp_path):
    run = tmp_path / "i"
    sets = [*TINY, "run.steps=1000", f"run.output_dir={tmp_path}", "run.name=i"]
    proc = _start(["train", *[a for s in sets for a in ("--set", s)]])
    try:
        _wait_for(lambda: _steps_logged(run) >= 1 or proc.poll() is not None, "step 1")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    summary = json.loads((run / "summary.json").read_text())
    step = summary["steps"]
    assert summary["stopped"] == "interrupted" and 1 <= step < 1000
    checkpoints = [p.name for p in (run / "checkpoints").iterdir()]
    assert checkpoints == [f"step_{step:06d}"]  # taken at the stop, not a periodic one
    assert _steps_logged(run) == step  # the step in flight finished and was logged
    line = f"interrupted at step {step}; checkpoint step_{step:06d}; resume with: " \
           f"rldojo train --resume {run}"  # fmt: skip
    # an interrupt is no error: its one line on stderr has no "error:"; what the run said
    # (the handler's note; any "still generating" line) is on stdout with its other lines
    assert " ".join(err.split()) == line, err
    assert "SIGINT: stopping after the step in flight" in out
    cfg = load_config(run / "config.toml", [f"run.steps={step + 1}"])
    summary = run_training(cfg, run_dir=run, resume=True)
    assert summary["stopped"] == "steps" and summary["steps"] == step + 1
    assert _steps_logged(run) == step + 1


def test_sigterm_stops_sft_after_its_step_with_a_checkpoint(tmp_path):
    data = tmp_path / "demos.jsonl"
    demo = {"messages": [{"role": "user", "content": "What is 2 + 3?"},
                         {"role": "assistant", "content": "<answer>5</answer>"}],
            "tools": None, "passed": True, "task_id": "t", "env": "arith-v1"}  # fmt: skip
    data.write_text(json.dumps(demo) + "\n")
    run = tmp_path / "s"
    sets = ["model.name=tiny-random", "eval.tasks=0", "run.epochs=10000", "sft.batch_size=1",
            "run.report_to=[]", "run.threads=1"]  # fmt: skip
    proc = _start(["sft", "--data", str(data), "--run-dir", str(run),
                   *[a for s in sets for a in ("--set", s)]])  # fmt: skip
    try:
        _wait_for(lambda: _steps_logged(run, "sft") >= 1 or proc.poll() is not None, "a step")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    summary = json.loads((run / "summary.json").read_text())
    step = summary["steps"]
    assert summary["stopped"] == "interrupted" and 1 <= step < summary["steps_planned"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == [f"step_{step:06d}"]
    said = f"interrupted at step {step}; checkpoint step_{step:06d}; resume with: rldojo sft"
    assert " ".join(err.split()) == f"{said} --resume {run}", err


def test_a_second_signal_or_one_during_an_evaluation_interrupts_at_once():
    said: list[str] = []
    before = signal.getsignal(signal.SIGINT)  # the default, or SIG_IGN under `nohup ... &`
    with Interrupts(said.append) as interrupts:
        signal.raise_signal(signal.SIGINT)
        assert interrupts.requested == "SIGINT" and not interrupts.aborted
        assert said == ["SIGINT: stopping after the step in flight (again to abort at once)"]
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        assert interrupts.aborted
    with Interrupts(said.append) as interrupts, interrupts.immediate():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        assert interrupts.requested == "SIGTERM" and not interrupts.aborted
    assert signal.getsignal(signal.SIGINT) is before  # restored
