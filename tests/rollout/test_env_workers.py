"""Environment worker processes: blocking, crashing and killed environments cost a worker,
never the run; episodes on a dead worker replay and end as they would have."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rldojo.envs.registry import register
from rldojo.rollout.env_pool import EnvWorkerPool
from rldojo.rollout.episodes import collect_rollouts
from rldojo.types import Completion, Observation, SamplingParams, StepResult, Task

pytestmark = pytest.mark.slow  # environment worker processes


class CountEnv:
    """Three turns of counting; task `i` misbehaves at turn 2 when `i == bad`:
    `block` sleeps synchronously, `raise` raises, `exit` kills its process (every time),
    `exit_once` kills it the first time only (a marker file remembers), `slow` writes its
    worker's pid to the marker file and awaits until that worker is killed (the first time
    only: a replay finds the marker and goes on)."""

    env_id = "count-v1"

    def __init__(
        self, mode: str = "ok", bad: int = 1, marker: str = "", noisy: bool = False,
        noisy_steps: bool = False,
    ):  # fmt: skip
        self.mode, self.bad, self.marker, self.noisy = mode, bad, marker, noisy
        self.noisy_steps = noisy_steps
        self.task: Task | None = None
        self.turn = 0

    def tasks(self, split="train", *, seed=0, n=None):
        return [Task(id=f"c/{i}", prompt="", env="count-v1", info={"i": i}) for i in range(n or 6)]

    async def reset(self, task, *, seed):
        self.task, self.turn = task, 0
        start = random.random() if self.noisy else seed % 10
        return Observation([{"role": "user", "content": f"count from {start}"}])

    async def step(self, action):
        assert self.task is not None
        self.turn += 1
        if self.task.info["i"] == self.bad and self.turn == 2:
            self._misbehave()
            if self.mode == "slow" and not Path(self.marker).exists():
                Path(f"{self.marker}.tmp").write_text(str(os.getpid()))
                os.replace(f"{self.marker}.tmp", self.marker)  # whole: the killer reads it
                await asyncio.sleep(3600)  # the loop stays free; only a kill ends this
        noise = f" {random.random()}" if self.noisy_steps else ""
        reply = {"role": "user", "content": f"turn {self.turn} got {action}{noise}"}
        return StepResult([reply], done=self.turn >= 3, info={"turns": self.turn})

    def _misbehave(self) -> None:
        if self.mode == "block":
            time.sleep(3600)  # synchronous: an in-process env would stall the event loop
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "exit" or (self.mode == "exit_once" and not Path(self.marker).exists()):
            Path(self.marker or os.devnull).touch() if self.marker else None
            os._exit(3)

    async def close(self):
        pass

    def default_grader(self):
        raise NotImplementedError


register("count-v1", CountEnv, overwrite=True)


class WordPolicy:
    """Says `w{turn}` each turn; encodes each message as one token."""

    version = 0
    tokenizer = None  # its ids are no tokenizer's

    def __init__(self) -> None:
        self.turn = 0

    def encode_chat(self, messages):
        return [len(m["content"]) for m in messages]

    def generate(self, prompts, sampling):
        self.turn += 1
        text = f"w{self.turn}"
        return [Completion(text, (7,), (-0.5,), "stop", (1.0,)) for _ in prompts]


def _run(make_env, n=4, timeout_s=60.0):
    tasks = CountEnv().tasks(n=n)
    return asyncio.run(
        collect_rollouts(
            make_env, WordPolicy(), [(t, 0, 100 + i) for i, t in enumerate(tasks)],
            SamplingParams(max_new_tokens=4), env_timeout_s=timeout_s,
        )
    )  # fmt: skip


@pytest.fixture
def pool():
    # Generous: no test but the blocking one is about timeouts (it sets its own).
    p = EnvWorkerPool(2, timeout_s=60.0, retries=2, backoff_s=0.05)
    yield p
    p.close()


def _gone(pid: int, wait_s: float = 60.0) -> bool:
    """Whether process `pid` is gone (reaped), waiting up to `wait_s` for it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _remote(pool, **kwargs):
    return lambda task: pool.make_env("count-v1", kwargs)


def test_remote_episodes_equal_in_process_ones(pool):
    local = _run(lambda task: CountEnv())
    remote = _run(_remote(pool))
    assert [r.status for r in remote] == ["ok"] * 4, [r.error for r in remote]
    assert [r.messages for r in remote] == [r.messages for r in local]
    assert [r.completion_ids for r in remote] == [r.completion_ids for r in local]
    assert pool.metrics() == {
        "env_workers/replaced": 0,
        "env_workers/replays": 0,
        "env_workers/regrades": 0,
    }


def test_synchronously_blocking_env_times_out_and_others_finish(pool):
    # The timeout under test. The blocked call blocks for an hour; the other calls take
    # milliseconds once their worker runs (its start-up is not counted), and an episode
    # stuck behind the blocked one waits up to twice this for its worker to be killed.
    pool.timeout_s = 5.0
    started = time.monotonic()
    rollouts = _run(_remote(pool, mode="block", bad=1), timeout_s=pool.timeout_s)
    assert time.monotonic() - started < 120  # the stuck call (an hour) did not stall the loop
    assert [r.status for r in rollouts] == ["ok", "timeout", "ok", "ok"], [
        r.error for r in rollouts
    ]
    assert "env.step took longer than 5s" in rollouts[1].error
    # the stuck worker was killed; episodes that shared it replayed on a fresh one
    assert pool.metrics()["env_workers/replaced"] >= 1
    replayed = [r for r in rollouts if r.info.get("env/replays")]
    assert replayed and all(r.status == "ok" for r in replayed)
    assert all(len(r.messages) == 6 for i, r in enumerate(rollouts) if i != 1)


def test_env_exception_is_env_error(pool):
    rollouts = _run(_remote(pool, mode="raise", bad=2))
    assert [r.status for r in rollouts] == ["ok", "ok", "env_error", "ok"]
    assert "EnvCallError: RuntimeError: boom" in rollouts[2].error
    assert pool.metrics()["env_workers/replaced"] == 0  # an exception is not a dead worker


def test_worker_that_dies_once_is_replayed_to_the_same_result(pool, tmp_path):
    marker = str(tmp_path / "died")
    local = _run(lambda task: CountEnv())
    rollouts = _run(_remote(pool, mode="exit_once", bad=0, marker=marker))
    assert Path(marker).exists()  # the worker really exited
    assert [r.status for r in rollouts] == ["ok"] * 4
    assert [r.messages for r in rollouts] == [r.messages for r in local]
    assert rollouts[0].info["env/replays"] == 1
    assert pool.metrics()["env_workers/replays"] >= 1


def test_env_that_always_kills_its_worker_fails_after_retries(pool):
    rollouts = _run(_remote(pool, mode="exit", bad=0))
    assert rollouts[0].status == "env_error"
    assert "WorkerDied" in rollouts[0].error and "replays)" in rollouts[0].error
    assert [r.status for r in rollouts[1:]] == ["ok"] * 3


def test_nondeterministic_env_is_not_replayed_silently(pool, tmp_path):
    marker = str(tmp_path / "died")
    rollouts = _run(_remote(pool, mode="exit_once", bad=0, marker=marker, noisy=True))
    assert rollouts[0].status == "env_error"
    assert "not deterministic" in rollouts[0].error


def test_replay_checks_every_reply_not_only_the_opening(pool, tmp_path):
    marker = str(tmp_path / "died")
    rollouts = _run(_remote(pool, mode="exit_once", bad=0, marker=marker, noisy_steps=True))
    assert rollouts[0].status == "env_error"  # turn 1's reply differed on replay
    assert "not deterministic" in rollouts[0].error


def test_worker_killed_from_outside_mid_rollout(pool, tmp_path):
    """`kill -9` of a worker process while its episodes wait: they replay elsewhere."""
    local = _run(lambda task: CountEnv())
    marker = tmp_path / "slow"
    pids: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists():  # episode 0 is inside its slow turn once it exists
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        pids.append(int(marker.read_text()))
        os.kill(pids[0], signal.SIGKILL)

    thread = threading.Thread(target=killer)
    thread.start()
    rollouts = _run(_remote(pool, mode="slow", bad=0, marker=str(marker)))
    thread.join()
    assert pids, "episode 0 never reached its slow turn"
    assert _gone(pids[0]), f"worker {pids[0]} still exists"  # host-side: that process is gone
    assert [r.status for r in rollouts] == ["ok"] * 4
    assert [r.messages for r in rollouts] == [r.messages for r in local]
    assert pool.metrics()["env_workers/replays"] >= 1


def test_workers_die_with_the_trainer(tmp_path):
    """`kill -9` of the trainer leaves no worker behind, even one stuck in blocking code."""
    script = tmp_path / "trainer.py"
    script.write_text(
        "import asyncio, sys\n"
        "from rldojo.rollout.env_pool import EnvWorkerPool\n"
        "from rldojo.types import Task\n"
        "pool = EnvWorkerPool(1, timeout_s=600)\n"
        "env = pool.make_env('arith-v1', {})\n"
        "task = Task(id='t', prompt='1+1', answer='2', env='arith-v1')\n"
        "asyncio.run(env.reset(task, seed=0))\n"
        "print(pool._slots[0].process.pid, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    os.kill(pid, 0)  # the worker is up
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:  # gone, or a zombie (this process may be a subreaper: sandbox tests set it)
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                os.waitpid(pid, os.WNOHANG)
                return
        except (FileNotFoundError, ChildProcessError):
            return
        time.sleep(0.05)
    pytest.fail(f"env worker {pid} outlived its trainer")
