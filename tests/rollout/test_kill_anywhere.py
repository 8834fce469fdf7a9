"""Durability: `rldojo train` SIGKILLed at any instant and resumed ends as if never killed.

The requirement: after `kill -9` at any moment, `rldojo train --resume RUN` loses no
completed rollout, trains on none twice, and continues step numbering, optimizer,
scheduler, RNG and data order; in deterministic mode on CPU the interrupted run ends with
the same weights and metrics as an uninterrupted one.

How the kills land where they should: the child process is the real CLI plus one
observer. Wrappers around the phases of a step (model load, generation, grading, ledger
writes, optimizer step, checkpoint save) append `begin`/`end` lines to a trace file, and
a kill plan (seeded) SIGKILLs the child inside or right after the n-th occurrence of a
phase. The offset inside a phase is a random fraction of that phase's duration in an
uninterrupted run of the same config, timed by this test; a "clock" kill comes from the
parent at a uniform instant of what that run took. Each kill is resumed with
`rldojo train --resume RUN` until the run completes; run with `-s` to see where each
kill landed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import warm
from safetensors.torch import load_file
from tiny_config import tiny_overrides

from rldojo.config import dump_config, load_config
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.types import Score, Task

pytestmark = pytest.mark.slow  # SIGKILLs rldojo train subprocesses

STEPS = 4
CHILD_TIMEOUT_S = 600  # one child run (a hang bound, never the point: ~10 s unloaded)
SEED = 7  # the kill plan: order, occurrences, offsets
GRADE_S = 0.03  # the grader waits (as real graders do), so a kill can land inside grading
OVERRIDES = tiny_overrides(
    "env.id=parity-slow-v1", "rollout.group_size=4", "sampling.max_new_tokens=6",
    "sampling.temperature=1.0", "optim.lr=1e-3", "run.deterministic=true",
    "run.checkpoint_every=1", f"run.steps={STEPS}",
    "run.threads=1",  # two threads on two shared cores wait on each other: 4x slower
    drop=["rollout.dynamic_sampling"],
)  # fmt: skip

# Kills inside a phase (a random fraction of its reference duration), right after the
# n-th call of a phase returns, in the middle of a ledger transaction (between INSERTs),
# or from the parent at a random instant of what the reference run took.
KILLS = [
    ("inside", "load"),
    ("inside", "generate"),
    ("inside", "grade"),
    ("mid", "ledger.add"),
    ("after", "ledger.add"),  # the round is committed, not trained on
    ("inside", "train"),
    ("after", "ledger.add_step"),  # the step is committed, its checkpoint is not
    ("clock", "run"),
    ("clock", "run"),
]


class SlowParityEnv(SingleTurnEnv):
    """Reward = parity of the sum of completion token ids; the grader takes GRADE_S."""

    env_id = "parity-slow-v1"

    def tasks(self, split="train", *, seed=0, n=None):
        return [
            Task(id=f"p/{split}/{i}", prompt=f"item {i}", env=self.env_id) for i in range(n or 30)
        ]

    def default_grader(self):
        return SlowParityGrader()


class SlowParityGrader:
    name = "slow-parity"

    async def grade(self, rollout, task):
        await asyncio.sleep(GRADE_S)
        return Score(value=float(sum(rollout.completion_ids) % 2))


register("parity-slow-v1", SlowParityEnv, overwrite=True)


# ---------------------------------------------------------------------- the child process


class _Observer:
    """Traces phases to a file and carries out the kill plan (in the child process)."""

    def __init__(self, trace: str, plan: dict[str, Any] | None) -> None:
        self.fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.plan = plan
        self.counts: dict[str, int] = {}
        self.open: list[str] = []
        self.dumps_in_add = 0
        self.timer: threading.Timer | None = None

    def write(self, *words: Any) -> None:
        line = " ".join(map(str, [*words, f"{time.time():.4f}"])) + "\n"
        os.write(self.fd, line.encode())  # unbuffered: the line is out before any kill

    def kill(self, how: str) -> None:
        self.write("kill", how, "open=" + ",".join(self.open))
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    def _is(self, kind: str, phase: str, n: int) -> bool:
        p = self.plan
        return p is not None and (p["kind"], p["phase"], p["n"]) == (kind, phase, n)

    def enter(self, phase: str) -> None:
        n = self.counts[phase] = self.counts.get(phase, 0) + 1
        self.open.append(phase)
        self.write("begin", phase, n)
        if phase == "ledger.add":
            self.dumps_in_add = 0
        if self._is("inside", phase, n):
            assert self.plan is not None
            how = f"inside:{phase}#{n}+{self.plan['delay']:.4f}s"
            self.timer = threading.Timer(self.plan["delay"], self.kill, (how,))
            self.timer.daemon = True
            self.timer.start()

    def leave(self, phase: str) -> None:
        n = self.counts[phase]
        if self._is("inside", phase, n) and self.timer is not None and self.timer.is_alive():
            # This occurrence ran faster than in the reference run: kill at its last
            # instant rather than not at all (still inside the phase).
            self.timer.cancel()
            self.kill(f"inside:{phase}#{n} at its end (ran shorter than planned)")
        self.open.remove(phase)
        self.write("end", phase, self.counts[phase])
        if self._is("after", phase, self.counts[phase]):
            self.kill(f"after:{phase}#{self.counts[phase]}")

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)
        if inspect.iscoroutinefunction(original):

            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                self.enter(phase)
                try:
                    return await original(*args, **kwargs)
                finally:
                    self.leave(phase)

            setattr(owner, name, traced_async)
            return

        def traced(*args: Any, **kwargs: Any) -> Any:
            self.enter(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self.leave(phase)

        setattr(owner, name, traced)

    def on_dumps(self) -> None:
        """Inside `Ledger.add`'s transaction: rows serialise one JSON field at a time."""
        if "ledger.add" not in self.open:
            return
        self.dumps_in_add += 1
        n = self.counts["ledger.add"]
        if self._is("mid", "ledger.add", n) and self.dumps_in_add == self.plan["at_dumps"]:
            self.kill(f"mid:ledger.add#{n} at json field {self.dumps_in_add}")


class _JsonSpy:
    """Stands in for `json` inside the ledger module to see each field it serialises."""

    def __init__(self, observer: _Observer) -> None:
        self._observer = observer

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    def dumps(self, *args: Any, **kwargs: Any) -> str:
        self._observer.on_dumps()
        return json.dumps(*args, **kwargs)


def child_main() -> None:
    """The child: `rldojo train ARGS` with the phases traced and the kill plan armed."""
    observer = _Observer(os.environ["KILL_TRACE"], json.loads(os.environ["KILL_PLAN"]))
    observer.enter("import")
    import rldojo.rollout.episodes as episodes_module
    import rldojo.store.ledger as ledger_module
    import rldojo.training.grpo as grpo_module
    import rldojo.training.rank_checkpoints as checkpoints_module
    import rldojo.training.run as run_module
    from rldojo.cli import app

    observer.leave("import")
    for owner, name, phase in (
        (run_module, "load_model", "load"),
        (episodes_module, "collect_rollouts", "generate"),  # deterministic: lockstep
        (episodes_module, "grade_rollouts", "grade"),
        (checkpoints_module, "save_checkpoint", "save"),  # where the trainer's save calls it
        (grpo_module.GrpoObjective, "train_on", "train"),
        (ledger_module.Ledger, "add", "ledger.add"),
        (ledger_module.Ledger, "mark_trained", "ledger.mark_trained"),
        (ledger_module.Ledger, "add_step", "ledger.add_step"),
    ):
        observer.wrap(owner, name, phase)
    ledger_module.json = _JsonSpy(observer)
    app(args=sys.argv[1:], prog_name="rldojo")


# ---------------------------------------------------------------------- the parent (the test)

_CHILD = (
    "import sys; sys.path[:0] = [{here!r}, {tests!r}]  # and pytest's pythonpath: tiny_config\n"
    "import test_kill_anywhere\n"
    "test_kill_anywhere.child_main()\n"
)


def _spawn(args: list[str], trace: Path, plan: dict[str, Any] | None) -> subprocess.Popen:
    """The child, forked from a warm interpreter (tests/warm.py: torch, transformers and
    rldojo imported): a dozen children cost their runs, not a dozen imports."""
    env = {**os.environ, "KILL_TRACE": str(trace), "KILL_PLAN": json.dumps(plan)}
    here = os.path.dirname(__file__)
    code = _CHILD.format(here=here, tests=os.path.dirname(here))
    return warm.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events(trace: Path) -> list[list[str]]:
    return [line.split() for line in trace.read_text().splitlines()] if trace.exists() else []


def _durations(trace: Path) -> dict[str, float]:
    """Mean duration of each phase in a traced run."""
    begins: dict[tuple[str, str], float] = {}
    spans: dict[str, list[float]] = {}
    for event in _events(trace):
        if event[0] == "begin":
            begins[(event[1], event[2])] = float(event[3])
        elif event[0] == "end":
            spans.setdefault(event[1], []).append(float(event[3]) - begins[(event[1], event[2])])
    return {phase: sum(s) / len(s) for phase, s in spans.items()}


def _where(trace: Path) -> str:
    """Where the child was when it died: the kill line, else the phases still open."""
    events = _events(trace)
    kills = [" ".join(e[1:-1]) for e in events if e[0] == "kill"]
    if kills:
        return kills[-1]
    open_: list[str] = []
    last = "interpreter start"
    for event in events:
        if event[0] == "begin":
            open_.append(event[1])
        elif event[0] == "end":
            open_.remove(event[1])
            last = f"{event[1]}#{event[2]}"
    return f"clock: open={','.join(open_)} after={last}"


def _checkpoint_step(run: Path) -> int:
    done = [p for p in (run / "checkpoints").glob("step_*") if (p / "state.json").exists()]
    return max((int(p.name.removeprefix("step_")) for p in done), default=0)


def _committed_steps(run: Path) -> int:
    """Steps whose first round is in the ledger (a resumed run reuses those rounds)."""
    if not (run / "ledger.sqlite").exists():
        return 0
    rows = _ledger_rows(run, "SELECT MAX(step) FROM rollouts")
    return 0 if rows[0][0] is None else rows[0][0] + 1


def _resume_args(run: Path, config: Path) -> list[str]:
    # A kill before the run wrote RUN/config.toml (its first act, but after the imports)
    # leaves nothing to resume from but the config the run was started with.
    if (run / "config.toml").exists():
        return ["train", "--resume", str(run)]
    return ["train", str(config), "--resume", str(run)]


FRESH = {"generate", "grade", "ledger.add"}  # phases that only run for rounds not yet graded


def _plan(
    kill: tuple[str, str], pending: list, run: Path, rng: random.Random, ref: dict[str, float]
) -> dict[str, Any]:
    """The kill plan of one attempt; `n` (1 or 2: which occurrence of the phase in this
    attempt) keeps enough ungraded rounds ahead for the pending kills that need one."""
    kind, phase = kill
    left = STEPS - _checkpoint_step(run)
    fresh = STEPS - max(_checkpoint_step(run), _committed_steps(run))
    need = sum(p in FRESH for _, p in pending)
    if phase == "save-final":  # the last checkpoint, or its rewrite by a resumed run
        plan: dict[str, Any] = {"kind": kind, "phase": "save", "n": max(left, 1)}
    elif phase == "save-again":
        plan = {"kind": kind, "phase": "save", "n": 1}
    else:
        n = 2 if fresh - 2 >= need and rng.random() < 0.5 else 1
        plan = {"kind": kind, "phase": phase, "n": 1 if phase in ("load", "run") else n}
    if kind == "inside":
        plan["delay"] = rng.uniform(0.05, 0.8) * ref[plan["phase"]]
    if kind == "mid":
        plan["at_dumps"] = rng.randint(1, 4 * 10)  # a round: >= 4 rows of 10 JSON fields
    if kind == "clock":  # up to the end of this run's remaining steps
        per_step = (ref["run"] - ref["start"]) / STEPS
        plan["delay"] = rng.uniform(0.0, 0.95 * (ref["start"] + left * per_step))
    return plan


def _run_until_complete(
    run: Path, config: Path, ref: dict[str, float], tmp: Path, seed: int
) -> list[str]:
    """Start the run, SIGKILL it per the plan, resume until it completes; where it died."""
    rng = random.Random(seed)
    # First the kills that need a round not yet graded, then the others, each in random order.
    first = [k for k in KILLS if k[1] in FRESH or k[1] == "load"]
    then = [k for k in KILLS if k not in first and k[0] != "clock"]
    pending = rng.sample(first, len(first)) + rng.sample(then, len(then))
    # Then kills at random instants, and kills around the final checkpoint: during it,
    # right after it (before the summary), and while a resumed run rewrites it.
    pending += [k for k in KILLS if k[0] == "clock"]
    pending += [("inside", "save-final"), ("after", "save-final"), ("inside", "save-again")]
    hits: list[str] = []
    attempt = 0
    while True:
        args = ["train", str(config)] if attempt == 0 else _resume_args(run, config)
        step = _checkpoint_step(run)
        plan = _plan(pending.pop(0), pending, run, rng, ref) if pending else None
        trace = tmp / f"trace_{attempt:02d}.txt"
        clock = plan is not None and plan["kind"] == "clock"
        proc = _spawn(args, trace, None if clock else plan)
        if clock:
            try:
                proc.wait(timeout=plan["delay"])
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        if plan is None:
            assert proc.returncode == 0, err[-3000:]
            return hits
        assert proc.returncode in (0, -signal.SIGKILL), err[-3000:]
        died = _where(trace) if proc.returncode else f"not killed: {plan}"
        if clock:
            died = f"{died} (+{plan['delay']:.2f}s)"
        hits.append(f"{attempt:2d} from step {step}: {died}")
        attempt += 1


def _ledger_rows(run: Path, query: str) -> list[tuple]:
    db = sqlite3.connect(run / "ledger.sqlite")
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


def _step_metrics(run: Path) -> list[dict[str, Any]]:
    rows = _ledger_rows(run, "SELECT step, metrics FROM steps ORDER BY step")
    return [{"step": s, **_deterministic(json.loads(m))} for s, m in rows]


def _jsonl_metrics(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [_deterministic(json.loads(line)) for line in lines]


def _deterministic(metrics: dict[str, Any]) -> dict[str, Any]:
    # Timings vary; `rollout/reused` counts rounds a resumed run took from the ledger.
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "rollout/reused"))}


ROWS = (
    "SELECT step, round, task_id, sample_index, seed, policy_version, completion_ids,"
    " logprobs, score_value, trained FROM rollouts ORDER BY step, round, id"
)


def _config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    overrides = [*OVERRIDES, f"run.output_dir={tmp_path}", f"run.name={name}"]
    path.write_text(dump_config(load_config(None, overrides)))
    return path


def _reference_run(tmp_path: Path) -> dict[str, float]:
    """Run uninterrupted (traced): mean phase durations, `start` (spawn to the first
    generation) and `run` (spawn to exit), in seconds."""
    trace = tmp_path / "trace_ref.txt"
    config = _config(tmp_path, "ref")
    proc = _spawn(["train", str(config)], trace, None)
    started = time.time()  # a clock kill's timer starts here too (the first spawn starts
    # the warm interpreter: not part of the run)
    _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0, err[-3000:]
    first_step = next(float(e[3]) for e in _events(trace) if e[:2] == ["begin", "generate"])
    return _durations(trace) | {"start": first_step - started, "run": time.time() - started}


@pytest.mark.timeout(3600)  # a dozen child runs: slow on a loaded machine, not a hang
def test_sigkill_anywhere_then_resume_ends_as_uninterrupted(tmp_path):
    ref = _reference_run(tmp_path)
    ref_run, run = tmp_path / "ref", tmp_path / "killed"
    hits = _run_until_complete(run, _config(tmp_path, "killed"), ref, tmp_path, seed=SEED)
    print("\n".join(["kills:", *hits]))
    # Every planned kill happened (a clock kill may come after the run ended).
    assert not [h for h in hits if "not killed" in h and "clock" not in h], hits

    # (1) The weights are bit-identical to the uninterrupted run's, at the end and at
    # every checkpoint; no half-written checkpoint is left over.
    checkpoints = [f"step_{s:06d}" for s in range(1, STEPS + 1)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints
    for name in checkpoints:
        a = load_file(ref_run / "checkpoints" / name / "model.safetensors")
        b = load_file(run / "checkpoints" / name / "model.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)

    # (2) Per-step metrics equal the uninterrupted run's: in the ledger and metrics.jsonl.
    assert _step_metrics(run) == _step_metrics(ref_run)
    assert [m["step"] for m in _step_metrics(run)] == list(range(1, STEPS + 1))
    assert _jsonl_metrics(run) == _jsonl_metrics(ref_run)

    # (3) The ledger holds every graded rollout once (none lost, none graded again) and
    # marks the same ones trained in the same steps; each step 1..k (rows: 0-based) has
    # one set of trained rollouts, each (task, sample) of it once.
    rows = _ledger_rows(run, ROWS)
    assert rows == _ledger_rows(ref_run, ROWS)
    keys = [(r[0], r[1], r[2], r[3]) for r in rows]
    assert len(keys) == len(set(keys))  # no (step, round, task, sample) committed twice
    trained = [(r[0], r[2], r[3]) for r in rows if r[-1]]
    assert len(trained) == len(set(trained))
    assert {step for step, _, _ in trained} == set(range(STEPS))
