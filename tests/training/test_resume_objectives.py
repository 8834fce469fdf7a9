"""One loop, one resume: each objective (GRPO, SFT, distillation) SIGKILLed in the middle of
a step and resumed ends with the weights of a run that was never killed.

The child is the real CLI (`rldojo.cli.main`) with one observer: `clipped_step` (the
optimizer step every objective ends its step with) SIGKILLs the process on its n-th call,
after the step's gradient is made and before the weights move; checkpoints are written
every step (`run.checkpoint_every = 1`), so the resume starts from the step before. Kills
land at that call whatever the machine's speed. Deterministic mode, one thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import warm
from safetensors.torch import load_file

from rldojo.store.checkpoint import latest_checkpoint

CHILD = """
import importlib, os, signal, sys
module = importlib.import_module(sys.argv[1])
kill_at, calls, original = int(sys.argv[2]), [0], module.clipped_step
def killing(*args, **kwargs):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)
module.clipped_step = killing
sys.argv = ["rldojo", *sys.argv[3:]]
from rldojo.cli import main
main()
"""

COMMON = ["model.autocast_bf16=false", "run.deterministic=true", "run.threads=1",
          "run.checkpoint_every=1", "run.report_to=[]", "eval.tasks=0"]  # fmt: skip

DEMOS = [("What is 2 + 3?", "<answer>5</answer>"), ("What is 7 - 4?", "<answer>3</answer>"),
         ("What is 6 * 2?", "<answer>12</answer>")]  # fmt: skip


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def _child(tmp: Path, module: str, kill_at: int, args: list[str]) -> subprocess.CompletedProcess:
    script = tmp / "child.py"
    script.write_text(CHILD)
    tests = str(Path(__file__).parents[1])  # coin_env: a random model's groups have signal
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    # forked from a warm interpreter (tests/warm.py): nine runs, not nine imports of torch
    return warm.run([sys.executable, str(script), module, str(kill_at), *args],
                    capture_output=True, text=True, timeout=600, env=env)  # fmt: skip


def _weights(run: Path) -> dict[str, torch.Tensor]:
    newest = latest_checkpoint(run / "checkpoints")
    assert newest is not None
    return load_file(newest / "model.safetensors")


def _sft_case(tmp: Path) -> tuple[str, list[str], list[str]]:
    data = tmp / "demos.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
             "tools": None, "passed": True, "task_id": f"t{i}", "env": "arith-v1"}
            for i, (q, a) in enumerate(DEMOS)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ["model.name=tiny-random", "run.epochs=2", "sft.batch_size=1", "optim.lr=1e-3", *COMMON]
    return "rldojo.training.run", ["sft", "--data", str(data), *_sets(sets)], ["sft"]


def _distill_case(student: Path) -> tuple[str, list[str], list[str]]:
    sets = [f"model.name={student}", "distill.teacher=tiny-random",
            "distill.sequences=student", "distill.divergence=reverse", "run.steps=6",
            "distill.batch_size=2", "sampling.max_new_tokens=4", "optim.lr=1e-3",
            *COMMON]  # fmt: skip
    return "rldojo.training.run", ["distill", *_sets(sets)], ["distill"]


def _grpo_case(tmp: Path) -> tuple[str, list[str], list[str]]:
    sets = ["model.name=tiny-random", "env.id=coin_env:CoinEnv", "run.steps=4",
            "rollout.prompts_per_step=2", "rollout.group_size=4", "sampling.max_new_tokens=6",
            "sampling.temperature=1.0", "optim.lr=1e-3", "rollout.dynamic_sampling=false",
            *COMMON]  # fmt: skip
    return "rldojo.training.update", ["train", *_sets(sets)], ["train"]


def _run_dir_args(command: str, run: Path) -> list[str]:
    if command == "sft":
        return ["--run-dir", str(run)]
    if command == "distill":
        return ["--out", str(run)]
    return ["--set", f"run.output_dir={run.parent}", "--set", f"run.name={run.name}"]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["grpo", "sft", "distill"])
def test_sigkill_mid_step_then_resume_ends_with_the_uninterrupted_weights(
    tmp_path, nudged_student, objective
):
    if objective == "sft":
        module, args, (command,) = _sft_case(tmp_path)
    elif objective == "distill":
        module, args, (command,) = _distill_case(nudged_student)
    else:
        module, args, (command,) = _grpo_case(tmp_path)
    ref, run = tmp_path / "ref", tmp_path / "run"
    done = _child(tmp_path, module, 0, [*args, *_run_dir_args(command, ref)])
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((ref / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["stopped"] == "steps" and steps >= 4
    killed = _child(tmp_path, module, 3, [*args, *_run_dir_args(command, run)])
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (run / "summary.json").exists()
    assert latest_checkpoint(run / "checkpoints").name == "step_000002"  # the 3rd step died
    resumed = _child(tmp_path, module, 0, [command, "--resume", str(run)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = json.loads((run / "summary.json").read_text())
    assert after["steps"] == steps and after["stopped"] == "steps"
    mine, theirs = _weights(run), _weights(ref)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] != "eval"] == list(range(1, steps + 1))
