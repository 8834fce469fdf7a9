"""Fault injection: crashing and hanging environments, graders and policy backends.

Each failure must become a status on the rollout or score, be excluded from the
gradient, be counted in the step metrics and the ledger, and never hang or crash the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

import pytest
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
from rldojo.training.loop import run_training
from rldojo.types import Completion, Score, Task

pytestmark = pytest.mark.slow  # trains tiny-random; worker processes

N_TASKS = 40
# What the watchdog logged about grading (the log test's handler appends; a plain list,
# as FaultGrader travels to worker processes by value, and a lock does not pickle).
LOGGED: list[str] = []


class _ExactGrader:
    name = "exact"

    async def grade(self, rollout, task):
        return Score(value=float(len(rollout.completion) % 2))  # varies: groups carry signal


class FaultEnv(SingleTurnEnv):
    """Task i fails by `mode` when i % 4 == 0; the others behave."""

    env_id = "fault-v1"

    def __init__(self, mode: str = "crash", grader_mode: str = "ok") -> None:
        super().__init__()
        self.mode, self.grader_mode = mode, grader_mode

    def tasks(self, split="train", *, seed=0, n=None):
        return [
            Task(
                id=f"f/{split}/{i}", prompt=f"say {i}", answer=str(i), env="fault-v1", info={"i": i}
            )
            for i in range(n or N_TASKS)
        ]

    async def reset(self, task, *, seed):
        if task.info["i"] % 4 == 0:
            if self.mode == "crash":
                raise RuntimeError("environment crashed")
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode == "block":  # synchronous: needs env worker processes
                time.sleep(3600)
            if self.mode == "exit":  # the worker process dies, every time
                os._exit(1)
        return await super().reset(task, seed=seed)

    def default_grader(self):
        return FaultGrader(self.grader_mode)


class FaultGrader:
    name = "fault-grader"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def grade(self, rollout, task):
        if task.info["i"] % 4 == 1:
            if self.mode == "raise":
                raise ValueError("grader bug")
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode == "until_logged":  # in-process only: hangs until the warning
                while not LOGGED:
                    await asyncio.sleep(0.01)
            if self.mode == "block":  # synchronous: needs graders in worker processes
                time.sleep(3600)
            if self.mode == "exit":  # kills its worker process, every time
                os._exit(1)
            if self.mode == "block":  # synchronous: needs env worker processes
                time.sleep(3600)
            if self.mode == "exit":  # the worker process dies, every time
                os._exit(1)
        return Score(value=float(len(rollout.completion) % 2))


register("fault-v1", FaultEnv, overwrite=True)


def _config(tmp_path, name, *extra):
    return load_config(None, tiny_overrides(
        "env.id=fault-v1", "rollout.prompts_per_step=4", "rollout.env_timeout_s=1",
        "rollout.grade_timeout_s=1", "sampling.temperature=1.0", "run.steps=1",
        f"run.output_dir={tmp_path}", f"run.name={name}", *extra,
    ))  # fmt: skip


def _steps(tmp_path, name):
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "time/step" in m]


@pytest.mark.parametrize(
    ("kwargs", "key", "count", "workers"),
    [
        ({"mode": "crash"}, "rollout/status_env_error", 2, 0),
        ({"mode": "hang"}, "rollout/status_timeout", 2, 0),
        ({"mode": "ok", "grader_mode": "raise"}, "grade/status_error", 2, 0),
        ({"mode": "ok", "grader_mode": "hang"}, "grade/status_timeout", 2, 0),
        # the same run with environments in worker processes, plus what only they survive
        ({"mode": "crash"}, "rollout/status_env_error", 2, 2),
        ({"mode": "hang"}, "rollout/status_timeout", 2, 2),
        ({"mode": "block"}, "rollout/status_timeout", 2, 2),
        ({"mode": "exit"}, "rollout/status_env_error", 2, 2),
        # graders in worker processes (-1: rollout.grade_in_workers with 1 worker)
        ({"mode": "ok", "grader_mode": "raise"}, "grade/status_error", 2, -1),
        ({"mode": "ok", "grader_mode": "block"}, "grade/status_timeout", 2, -1),
        ({"mode": "ok", "grader_mode": "exit"}, "grade/status_error", 2, -1),
    ],
)
def test_failures_are_counted_and_excluded(tmp_path, kwargs, key, count, workers):
    kv = ", ".join(f'{k} = "{v}"' for k, v in kwargs.items())
    # A timeout under test ends a call that hangs for an hour. A call's clock starts when
    # its worker begins it, so the calls queued behind a blocked reset are not charged
    # that wait (the kill of their worker replays their episodes): exactly the failing
    # task's two episodes time out, whatever the load. The clock still bounds each call's
    # own run, milliseconds of work that on a loaded machine include waits for a CPU: a
    # 2-core CI machine whose other xdist worker runs a benchmark's dry run (the suite
    # starts its longest files together) saw healthy calls pass 5 s, so 20 s. Generous
    # otherwise: nothing should time out.
    timeout = 20 if "timeout" in key else 60
    started = time.monotonic()
    extra = [f"rollout.env_workers={max(workers, 0)}", "rollout.env_retries=1",
             f"rollout.grade_in_workers={str(workers < 0).lower()}",
             f"rollout.env_timeout_s={timeout}", f"rollout.grade_timeout_s={timeout}"]  # fmt: skip
    if "grader_mode" in kwargs:
        # No grader preflight: it grades reference answers, and task 1's meets the same
        # fault (a timeout waits 20 s more, an exiting worker is retried) in a phase these
        # cases do not assert on; the step's grading is what they check.
        extra.append("run.max_failure_rate=1.0")
    summary = run_training(_config(tmp_path, "f", f"env.kwargs={{{kv}}}", *extra))
    assert time.monotonic() - started < 600  # timeouts fire; nothing waits for an hour
    (step,) = _steps(tmp_path, "f")
    assert step[key] == count  # one group of G=2 per failing task (task 0 of 4)
    assert summary["rollouts"] == 8
    assert summary["rollouts_trained"] <= 8 - count  # failed samples never trained on
    bad = {k: v for k, v in summary["statuses"].items() if k != "ok/ok"}
    assert sum(bad.values()) == count
    if kwargs["mode"] in ("block", "exit"):  # the worker was killed or died, and replaced
        assert step["env_workers/replaced"] >= 1
    if kwargs.get("grader_mode") in ("block", "exit"):
        assert step["grade/workers_replaced"] >= 1
    if kwargs.get("grader_mode") == "exit":
        assert step["grade/workers_regrades"] >= 2  # retried on a fresh worker, then failed


class BrokenPolicy:
    version = 0
    tokenizer = None

    def encode_chat(self, messages):
        return [1, 2, 3]

    def generate(self, prompts, sampling):
        raise RuntimeError("backend exploded")

    def update_weights(self, state_dict=None):
        self.version += 1


def test_policy_backend_exception_is_a_status():
    env = FaultEnv(mode="ok")
    tasks = env.tasks(n=3)
    from rldojo.types import SamplingParams

    rollouts = asyncio.run(
        collect_rollouts(
            lambda: FaultEnv(mode="ok"),
            BrokenPolicy(),
            [(t, 0, 0) for t in tasks],
            SamplingParams(),
        )
    )
    assert [r.status for r in rollouts] == ["policy_error"] * 3
    assert all("backend exploded" in r.error for r in rollouts)
    scores = asyncio.run(grade_rollouts(_ExactGrader(), rollouts, tasks))
    assert [s.status for s in scores] == ["error"] * 3
    assert all(s.value is None for s in scores)


class EchoPolicy(BrokenPolicy):
    def generate(self, prompts, sampling):
        return [Completion("hello", (5, 6), (-0.1, -0.2), "stop", (1.0, 1.0)) for _ in prompts]


def test_grader_timeout_returns_promptly():
    env = FaultEnv(mode="ok", grader_mode="hang")
    tasks = env.tasks(n=4)
    from rldojo.types import SamplingParams

    rollouts = asyncio.run(
        collect_rollouts(
            lambda: FaultEnv(mode="ok"), EchoPolicy(), [(t, 0, 0) for t in tasks], SamplingParams()
        )
    )
    started = time.monotonic()
    scores = asyncio.run(grade_rollouts(env.default_grader(), rollouts, tasks, timeout_s=0.5))
    assert time.monotonic() - started < 60  # the hung grader would take an hour
    assert [s.status for s in scores] == ["ok", "timeout", "ok", "ok"]


class _Flag(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("still grading"):
            LOGGED.append(record.getMessage())


def test_long_phases_are_logged_with_what_they_wait_on(tmp_path, caplog):
    """A grader hangs (until the watchdog has logged the wait, or the generous grade
    timeout): the watchdog logs what the trainer waits on."""
    caplog.set_level("INFO", logger="rldojo.pipeline")  # progress, not a warning
    LOGGED.clear()
    flag = _Flag()
    logging.getLogger("rldojo.pipeline").addHandler(flag)
    kv = 'mode = "ok", grader_mode = "until_logged"'
    # No grader preflight (max_failure_rate 1): it would wait out the grade timeout on the
    # reference answers before the watchdog, which watches the steps, is there to log.
    cfg = _config(tmp_path, "w", f"env.kwargs={{{kv}}}", "rollout.wait_warn_s=0.3",
                  "rollout.grade_timeout_s=120", "run.max_failure_rate=1.0")  # fmt: skip
    try:
        run_training(cfg)
    finally:
        logging.getLogger("rldojo.pipeline").removeHandler(flag)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("still")]
    assert any("grading 8 samples with fault-grader" in m for m in waits), waits
