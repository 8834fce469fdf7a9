"""The run loop across crashes: every step and evaluation is logged once, as in a run that
never stopped (`metrics.jsonl`), whichever point of the loop the crash hit."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

from rldojo.config import load_config
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.training.grpo import GrpoObjective
from rldojo.training.loop import run_training
from rldojo.training.run import Run
from rldojo.types import Score, Task

pytestmark = pytest.mark.slow  # loads tiny-random or starts the CLI


class ParityEnv(SingleTurnEnv):
    """Short prompts; reward = parity of the completion's token ids (groups carry signal)."""

    env_id = "loop-parity-v1"

    def tasks(self, split="train", *, seed=0, n=None):
        return [
            Task(id=f"{split}/{i}", prompt=f"item {i}", env=self.env_id) for i in range(n or 10)
        ]

    def default_grader(self):
        return ParityGrader()


class ParityGrader:
    name = "parity"

    async def grade(self, rollout, task):
        return Score(value=float(sum(rollout.completion_ids) % 2))


register("loop-parity-v1", ParityEnv, overwrite=True)

TINY = [
    "model.name=tiny-random", "model.autocast_bf16=false", "env.id=loop-parity-v1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2", "rollout.dynamic_sampling=false", "sampling.max_new_tokens=4",
    "sampling.temperature=1.0", "eval.tasks=2", "eval.max_new_tokens=2", "eval.every=1",
    "env.train_tasks=10", "run.steps=2", "run.checkpoint_every=1", "run.deterministic=true",
    "run.threads=1",  # two threads on two shared cores wait on each other: 4x slower
]  # fmt: skip


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # `run.threads` sets them for the whole process
    yield
    torch.set_num_threads(threads)


class _Crash(Exception):
    """The process dies here."""


def _logged(run) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    # Timings vary; `rollout/reused` counts rounds a resumed run took from the ledger.
    skip = ("time/", "rollout/reused")
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in rows]


def _crash_in(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, when) -> None:
    original = getattr(owner, name)

    def crashing(*args, **kwargs):
        if when(*args, **kwargs):
            raise _Crash
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, crashing)


def test_a_run_crashed_anywhere_in_the_loop_logs_as_one_never_stopped(tmp_path, monkeypatch):
    run_training(load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=ref"]))
    evals = sorted(p.stem for p in (tmp_path / "ref" / "evals").glob("*.jsonl"))
    assert evals == ["after", "before", "step_1"]  # the last step's evaluation is "after"
    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=crash"])
    run = tmp_path / "crash"
    crashes = [
        # In the evaluation after step 1: it is part of step 1, redone with it.
        (Run, "evaluate", lambda self, label, progress=None: label == "step_1"),
        # In the final checkpoint, after step 2 logged its metrics and evaluations.
        (Run, "save", lambda self, state: self.step_num == 2),
        # After the final checkpoint: the resumed run has nothing left to log.
        (GrpoObjective, "summary", lambda self: True),
    ]
    for attempt, (owner, name, when) in enumerate(crashes):
        with monkeypatch.context() as m:
            _crash_in(m, owner, name, when)
            with pytest.raises(_Crash):
                run_training(cfg, run_dir=run, resume=attempt > 0)
    run_training(cfg, run_dir=run, resume=True)
    assert _logged(run) == _logged(tmp_path / "ref")
    assert [r["step"] for r in _logged(run) if "reward/mean" in r] == [1, 2]


def test_eval_before_false_skips_only_the_starting_evaluation(tmp_path):
    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=nobefore",
                             "eval.before=false", "eval.every=0", "run.steps=1"])  # fmt: skip
    out = io.StringIO()
    run_training(cfg, console=Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    # the evaluation shows how far it got before its result (a log: the start and the end)
    shown = [x for x in lines if x.startswith("evaluating ")]
    assert shown[0] == "evaluating after: 0/2" and shown[-1] == "evaluating after: 2/2"
    assert lines.index(shown[-1]) < next(
        i for i, x in enumerate(lines) if x.startswith("held-out accuracy (after)"))  # fmt: skip
    run = tmp_path / "nobefore"
    assert sorted(p.stem for p in (run / "evals").glob("*.jsonl")) == ["after"]
    assert [r["step"] for r in _logged(run) if r.get("kind") == "eval"] == [1]  # "after" only
    summary = json.loads((run / "summary.json").read_text())
    assert summary["accuracy_before"] is None and summary["accuracy_after"] is not None


def test_max_minutes_spent_stops_stepping_then_evaluates_and_checkpoints(tmp_path):
    # A budget far below one step's duration: spent after the first step, whatever the
    # machine's speed (no timing is assumed beyond "a step takes over 60 ns").
    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=budget",
                             "run.steps=3", "run.max_minutes=1e-9"])  # fmt: skip
    summary = run_training(cfg)
    run = tmp_path / "budget"
    assert summary["steps"] == 1 and summary["stopped"] == "max_minutes"
    # Step 1's evaluation is the final one ("after"), as for the last of run.steps.
    assert sorted(p.stem for p in (run / "evals").glob("*.jsonl")) == ["after", "before"]
    assert [r["step"] for r in _logged(run) if "reward/mean" in r] == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert json.loads((run / "summary.json").read_text())["stopped"] == "max_minutes"
    # Resumed without the budget, the run trains on to run.steps.
    more = load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=budget",
                              "run.steps=3"])  # fmt: skip
    assert run_training(more, run_dir=run, resume=True)["stopped"] == "steps"
    assert [r["step"] for r in _logged(run) if "reward/mean" in r] == [1, 2, 3]
