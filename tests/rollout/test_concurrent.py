"""The episodes engine (`rldojo.rollout.concurrent`): each episode its own coroutine over
the transformers backend's continuously batching engine, on tiny-random.

What it must do that the lockstep engine cannot: a slow environment never stalls the
other episodes; an environment's own bound on open episodes holds under a batch 4x its
size, and time spent waiting for a slot is no part of an episode's timeout; a crash mid
episode is a status and frees its slot. And what both engines share: the same episodes,
token for token, where neither samples (greedy), and each episode graded once."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts, play_and_grade
from rldojo.types import Observation, SamplingParams, Score, StepResult, Task

pytestmark = pytest.mark.slow  # tiny-random

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, seed=0)


@dataclass
class Book:
    """What the environments did, in order, across episodes."""

    events: list[tuple[str, str]] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0
    release: asyncio.Event | None = None


class TurnsEnv:
    """`turns` turns, whatever the policy says. Task "slow" waits in its first step until
    `book.release` is set; task "crash" raises in its second step; task "sleepy" sleeps
    `nap_s` in each step."""

    env_id = "turns-test"

    def __init__(self, book: Book, turns: int = 3, bound: int | None = None, nap_s=0.0):
        self.book, self.turns, self.bound, self.nap_s = book, turns, bound, nap_s
        self.task: Task | None = None
        self.turn = 0

    async def reset(self, task, *, seed):
        self.task, self.turn = task, 0
        self.book.open_now += 1
        self.book.most_open = max(self.book.most_open, self.book.open_now)
        self.book.events.append(("reset", task.id))
        return Observation([{"role": "user", "content": f"Say something, {task.prompt}."}])

    async def step(self, action):
        assert self.task is not None
        self.turn += 1
        if self.task.id == "slow" and self.turn == 1 and self.book.release is not None:
            await asyncio.wait_for(self.book.release.wait(), 120)
        if self.task.id == "crash" and self.turn == 2:
            raise RuntimeError("the app fell over")
        if self.nap_s:
            await asyncio.sleep(self.nap_s)
        done = self.turn >= self.turns
        return StepResult([] if done else [{"role": "user", "content": "more"}], done)

    async def close(self):
        self.book.open_now -= 1
        self.book.events.append(("close", self.task.id if self.task else "?"))


class Bounded(TurnsEnv):
    """`TurnsEnv` that holds `bound` episodes at once (a `BoundedEnv`)."""

    max_episodes_at_once_key = "bound"

    @property
    def max_episodes_at_once(self) -> int:
        assert self.bound is not None
        return self.bound


class CountingGrader:
    name = "count"

    def __init__(self) -> None:
        self.graded: list[str] = []

    async def grade(self, rollout, task):
        self.graded.append(task.id)
        return Score(value=float(len(rollout.completion_ids) % 2))


def _tasks(*names: str) -> list[tuple[Task, int, int]]:
    return [(Task(id=n, prompt=n, env="turns-test"), 0, i) for i, n in enumerate(names)]


@pytest.fixture(scope="module")
def policy(tiny):
    model, tokenizer = tiny
    engine = TransformersPolicy(model, tokenizer)
    yield engine
    engine.close()


def test_a_slow_environment_never_stalls_the_other_episodes(policy):
    """Episode "slow" waits in its first step until every other episode has ended: under
    the lockstep engine that would wait forever (its 30 s env timeout would end it)."""
    book = Book()
    names = ["slow", *(f"e{i}" for i in range(5))]
    others_done = 0

    async def main():
        nonlocal others_done
        book.release = asyncio.Event()

        async def ended(i, rollout):
            nonlocal others_done
            if rollout.task_id != "slow":
                others_done += 1
                if others_done == len(names) - 1:
                    book.release.set()

        return await collect_rollouts(
            lambda: TurnsEnv(book),
            policy,
            _tasks(*names),
            GREEDY,
            env_timeout_s=60,
            on_end=ended,
            engine="episodes",
        )

    rollouts = asyncio.run(main())
    assert [r.status for r in rollouts] == ["ok"] * len(names)
    assert [r.task_id for r in rollouts] == names  # request order, whatever the end order
    closes = [task for what, task in book.events if what == "close"]
    assert closes[-1] == "slow" and sorted(closes[:-1]) == sorted(names[1:])
    stats = policy.engine_stats()
    assert stats["decode_steps"] > 0 and stats["decode_rows"] > stats["decode_steps"]


def test_a_bound_holds_under_a_batch_four_times_its_size_and_a_crash_frees_its_slot(policy):
    book = Book()
    names = ["crash", *(f"e{i}" for i in range(7))]
    grader = CountingGrader()

    async def main():
        return await play_and_grade(
            lambda: Bounded(book, bound=2),
            policy,
            grader,
            _tasks(*names),
            GREEDY,
            engine="episodes",
        )

    rollouts, scores = asyncio.run(main())
    assert book.most_open == 2 and book.open_now == 0
    assert rollouts[0].status == "env_error" and "the app fell over" in rollouts[0].error
    assert [r.status for r in rollouts[1:]] == ["ok"] * 7
    assert scores[0].status == "error" and all(s.status == "ok" for s in scores[1:])
    assert sorted(grader.graded) == sorted(names[1:])  # each graded once; the crash not


def test_waiting_for_a_slot_is_no_part_of_the_timeout(policy):
    """One slot, env calls bounded at 2 s, episodes that hold the slot 2.4 s each (two
    1.2 s steps): the second waits longer than the timeout for its slot, and is not
    charged for it."""
    book = Book()

    async def main():
        return await collect_rollouts(
            lambda: Bounded(book, turns=2, bound=1, nap_s=1.2),
            policy,
            _tasks("a", "b"),
            GREEDY,
            env_timeout_s=2.0,
            engine="episodes",
        )

    rollouts = asyncio.run(main())
    assert [r.status for r in rollouts] == ["ok", "ok"]
    assert book.events == [("reset", "a"), ("close", "a"), ("reset", "b"), ("close", "b")]


def test_both_engines_play_the_same_episodes_when_neither_samples(policy):
    async def main(engine):
        book = Book()
        return await collect_rollouts(
            lambda: TurnsEnv(book), policy, _tasks("x", "y", "z"), GREEDY, engine=engine
        )

    lockstep, episodes = asyncio.run(main("lockstep")), asyncio.run(main("episodes"))
    assert [r.completion_ids for r in episodes] == [r.completion_ids for r in lockstep]
    assert [r.policy_mask for r in episodes] == [r.policy_mask for r in lockstep]
    assert all(len(r.messages) == 6 for r in episodes)  # user, 3 turns, 2 answers


def test_a_training_run_plays_its_rounds_with_the_episodes_engine(tmp_path):
    """`rollout.engine = "episodes"` end to end: the steps train, and each reports the
    engine's decode batch; the held-out evaluation runs on the same engine."""
    import coin_env  # noqa: F401  (registers coin-v1)
    from tiny_config import tiny_overrides

    from rldojo.config import load_config
    from rldojo.training.loop import run_training

    cfg = load_config(
        None,
        tiny_overrides(
            "env.id=coin-v1",
            "rollout.engine=episodes",
            "rollout.group_size=4",
            "sampling.max_new_tokens=6",
            "sampling.temperature=1.0",
            "run.steps=2",
            "eval.tasks=2",
            f"run.output_dir={tmp_path}",
            "run.name=e",
        ),
    )
    summary = run_training(cfg)
    assert summary["steps"] == 2
    rows = [json.loads(x) for x in (tmp_path / "e" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "time/step" in m]
    assert len(steps) == 2 and all(m["time/decode_batch"] >= 1 for m in steps)
    assert all(0 < m["time/engine_busy"] <= 1 for m in steps)
    assert summary["accuracy_before"] is not None and summary["accuracy_after"] is not None
