"""A fourth objective is one file: `tests/dpo_objective.py` (DPO on preference pairs) runs in
the run loop with the run's model, optimizer, evaluation, checkpoints and resume, none of
which it builds itself."""

from __future__ import annotations

import json

import pytest
import torch
from dpo_objective import DpoObjective
from safetensors.torch import load_file

from rldojo.config import load_config
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.training.callbacks import Callback
from rldojo.training.loop import run_loop
from rldojo.training.run import Run

PAIRS = [("What is 2 + 3?", "<answer>5</answer>", "I do not know."),
         ("What is 7 - 4?", "<answer>3</answer>", "seven"),
         ("What is 6 * 2?", "<answer>12</answer>", "<answer>8</answer>"),
         ("What is 9 + 1?", "<answer>10</answer>", "nine and one")]  # fmt: skip

SETS = ["model.name=tiny-random", "model.autocast_bf16=false", "optim.lr=1e-3",
        "optim.warmup_steps=0", "run.deterministic=true", "run.threads=1",
        "run.report_to=[]", "eval.tasks=2", "eval.max_new_tokens=2"]  # fmt: skip


class _StopAfter(Callback):
    def __init__(self, step: int) -> None:
        self.step, self.seen = step, 0

    def on_step_end(self, step: int, metrics: dict) -> None:
        self.seen = step

    def should_stop(self) -> bool:
        return self.seen >= self.step


def _dpo(tmp_path, name: str, *, resume: bool = False, callbacks=()) -> dict:
    cfg = load_config(None, [*SETS, f"run.output_dir={tmp_path}", f"run.name={name}"])
    run_dir = tmp_path / name
    return run_loop(lambda d: DpoObjective(Run(cfg, run_dir, resume=resume, dist=d), PAIRS),
                    cfg, run_dir, command="dpo", resume=resume,
                    callbacks=callbacks)  # fmt: skip


def _weights(run_dir) -> dict[str, torch.Tensor]:
    newest = latest_checkpoint(run_dir / "checkpoints")
    assert newest is not None
    return load_file(newest / "model.safetensors")


@pytest.mark.slow
def test_dpo_trains_evaluates_checkpoints_and_resumes_through_the_run(tmp_path):
    whole = _dpo(tmp_path, "whole")
    assert whole["command"] == "dpo" and whole["steps"] == 4 and whole["stopped"] == "steps"
    assert whole["loss_last"] < whole["loss_first"]  # the chosen replies gained on the rest
    assert whole["accuracy_before"] is not None and whole["accuracy_after"] is not None
    records = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").open()]
    steps = [r for r in records if r.get("kind") == "dpo"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert steps[0]["dpo/margin"] == 0.0 and steps[-1]["dpo/margin"] > 0  # π = π_ref at first

    stopped = _dpo(tmp_path, "split", callbacks=[_StopAfter(2)])
    assert stopped["stopped"] == "callback" and stopped["steps"] == 2
    resumed = _dpo(tmp_path, "split", resume=True)
    assert resumed["steps"] == 4 and resumed["loss_first"] == whole["loss_first"]
    assert resumed["loss_last"] == whole["loss_last"]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
