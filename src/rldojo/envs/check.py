"""`check_env`: does an environment keep the `Env` contract? For ours and for users'.

    report = check_env("crm-v1")                  # an id, a factory, or an instance
    print(report)                                 # one line per check
    report.raise_for_failures()                   # EnvCheckError listing what failed

It never raises for a broken environment; it returns a `CheckReport` whose checks say
what passed, what failed and why (an exception inside the environment is a failed check
naming the exception). `rldojo check-env ID` prints the report and exits 1 on failure.

Checks, in order (each bounded by `timeout_s`):

- ``construct``: the factory builds an object with the `Env` protocol's members;
- ``tasks``: ``tasks("train", seed, n)`` returns `Task`s with ids, the same for the same seed;
- ``reset``: the same task and seed give the same opening (two fresh instances);
- ``step``: the same actions after the same reset give the same replies, `done` flags and
  info (info keys starting with ``time/`` are ignored);
- ``bad_actions``: empty, huge, binary-ish, malformed tool calls, unknown tools and
  nonsense moves come back as a `StepResult` (an error observation), never an exception;
- ``step_after_done``: once an episode ended, `step` raises `EpisodeDone`;
- ``snapshot``: where `snapshot`/`restore` exist, restoring replays the same step exactly,
  and a snapshot taken right after a restore equals the one restored;
- ``grader``: `default_grader().grade(...)` on a finished episode returns a `Score`;
- ``close``: `close()` can be called twice.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rldojo.envs.base import Env, EpisodeDone
from rldojo.envs.registry import make_env
from rldojo.types import Observation, Rollout, Score, StepResult, Task

__all__ = [
    "BAD_ACTIONS",
    "CheckReport",
    "CheckResult",
    "EnvCheckError",
    "check_env",
    "check_env_async",
]

BAD_ACTIONS: tuple[str, ...] = (
    "",
    "x" * 100_000,
    "\x00\x01\x7f \udcff \U0001f600",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    '<tool_call>{"name": 5, "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": 7}}</tool_call>',
    "<tool_call>" * 50,
    "<answer>",
    "<move>99999999999999999999</move>",
    "Answer: \\boxed{",
)
"""Actions every environment must answer with a `StepResult`, not an exception."""
FILLER = "<answer>0</answer>\nAnswer: 0"
"""The action used to drive an episode to its end (answers end most episodes)."""
PLAIN = "Let me think about this."


class EnvCheckError(AssertionError):
    """`CheckReport.raise_for_failures` found failed checks; the message lists them."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    message: str = ""


@dataclass
class CheckReport:
    env_id: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def raise_for_failures(self) -> None:
        if not self.ok:
            raise EnvCheckError(str(self))

    def __str__(self) -> str:
        lines = [f"check_env {self.env_id}: {'PASS' if self.ok else 'FAIL'}"]
        for r in self.results:
            lines.append(f"  [{'ok' if r.passed else 'FAIL'}] {r.name}: {r.message}")
        return "\n".join(lines)


def _canon(value: object) -> str:
    """A canonical text form for comparing results (timing keys dropped)."""
    if isinstance(value, Observation | StepResult):
        info = {k: v for k, v in value.info.items() if not str(k).startswith("time/")}
        extra = {"done": value.done} if isinstance(value, StepResult) else {}
        value = {"messages": value.messages, "info": info, **extra}
    return json.dumps(value, sort_keys=True, default=repr)


class _Checker:
    def __init__(
        self, factory: Callable[[], Env], seed: int, n_tasks: int, timeout_s: float, max_steps: int
    ):
        self.factory, self.seed, self.n_tasks = factory, seed, n_tasks
        self.timeout_s, self.max_steps = timeout_s, max_steps
        self.report = CheckReport("?")
        self.task: Task | None = None

    async def run(self, name: str, check: Callable[[], Awaitable[str]]) -> bool:
        try:
            message = await asyncio.wait_for(check(), self.timeout_s)
            self.report.results.append(CheckResult(name, True, message))
            return True
        except AssertionError as exc:
            self.report.results.append(CheckResult(name, False, str(exc)))
        except TimeoutError:
            self.report.results.append(
                CheckResult(name, False, f"took longer than {self.timeout_s:g}s")
            )
        except Exception as exc:
            why = f"raised {type(exc).__name__}: {exc}"
            self.report.results.append(CheckResult(name, False, why[:500]))
        return False

    async def fresh(self) -> tuple[Env, Observation]:
        env = self.factory()
        assert self.task is not None
        return env, await env.reset(self.task, seed=self.seed)

    async def construct(self) -> str:
        env = self.factory()
        missing = [
            m
            for m in ("env_id", "tasks", "reset", "step", "close", "default_grader")
            if not hasattr(env, m)
        ]
        assert not missing, f"not an Env: missing {', '.join(missing)}"
        self.report.env_id = str(env.env_id)
        return f"{type(env).__name__} ({env.env_id})"

    async def tasks(self) -> str:
        env = self.factory()
        first = list(env.tasks("train", seed=self.seed, n=self.n_tasks))
        again = list(env.tasks("train", seed=self.seed, n=self.n_tasks))
        assert first, "tasks('train') returned no tasks"
        assert all(isinstance(t, Task) and t.id for t in first), (
            "tasks must be Task objects with ids"
        )
        assert [(t.id, t.prompt) for t in first] == [(t.id, t.prompt) for t in again], (
            "tasks('train', seed) differ between two calls with the same seed"
        )
        self.task = first[0]
        return f"{len(first)} tasks, deterministic"

    async def reset(self) -> str:
        (_, a), (_, b) = await self.fresh(), await self.fresh()
        assert isinstance(a, Observation), f"reset returned {type(a).__name__}, not Observation"
        assert a.messages, "reset returned no messages"
        assert _canon(a) == _canon(b), "same task and seed gave different openings"
        return "same seed, same start"

    async def _play(self, actions: Sequence[str]) -> list[str]:
        env, _ = await self.fresh()
        out = []
        for action in actions:
            result = await env.step(action)
            assert isinstance(result, StepResult), f"step returned {type(result).__name__}"
            out.append(_canon(result))
            if result.done:
                break
        return out

    async def step(self) -> str:
        actions = [PLAIN, BAD_ACTIONS[3], FILLER]
        first, second = await self._play(actions), await self._play(actions)
        for i, (x, y) in enumerate(zip(first, second, strict=False)):
            assert x == y, (
                f"step {i + 1} differs between two runs with the same seed:\n{x[:300]}\n{y[:300]}"
            )
        return f"{len(first)} steps replayed identically"

    async def bad_actions(self) -> str:
        for action in BAD_ACTIONS:
            env, _ = await self.fresh()
            try:
                result = await env.step(action)
            except Exception as exc:
                raise AssertionError(
                    f"step({action[:40]!r}) raised {type(exc).__name__}: {exc}; bad actions must "
                    "produce an error observation"
                ) from None
            assert isinstance(result, StepResult), f"step returned {type(result).__name__}"
        return f"{len(BAD_ACTIONS)} bad actions answered"

    async def finish(self, env: Env) -> list[StepResult]:
        results: list[StepResult] = []
        for _ in range(self.max_steps):
            results.append(await env.step(FILLER if len(results) % 2 == 0 else PLAIN))
            if results[-1].done:
                return results
        raise AssertionError(f"episode did not end within {self.max_steps} steps")

    async def step_after_done(self) -> str:
        env, _ = await self.fresh()
        results = await self.finish(env)
        try:
            await env.step(FILLER)
        except EpisodeDone:
            return f"ended after {len(results)} step(s); further step refused with EpisodeDone"
        except Exception as exc:
            raise AssertionError(
                f"step after done raised {type(exc).__name__}, not EpisodeDone"
            ) from None
        raise AssertionError("step after done returned a result instead of raising EpisodeDone")

    async def snapshot(self) -> str:
        env, _ = await self.fresh()
        if not (hasattr(env, "snapshot") and hasattr(env, "restore")):
            return "skipped: no snapshot()/restore()"
        if (await env.step(PLAIN)).done:  # a one-turn episode: snapshot the opening instead
            env, _ = await self.fresh()
        snap = env.snapshot()
        first = _canon(await env.step(FILLER))
        env.restore(snap)
        assert env.snapshot() == snap, (
            "a snapshot taken right after restore() differs from the restored one"
        )
        second = _canon(await env.step(FILLER))
        assert first == second, f"the step after restore differs:\n{first[:300]}\n{second[:300]}"
        return "restore replays the same step; snapshot round-trips"

    async def grader(self) -> str:
        env, obs = await self.fresh()
        assert self.task is not None
        results = await self.finish(env)
        info: dict[str, Any] = {}
        for r in results:
            info.update(r.info)
        rollout = Rollout(
            task_id=self.task.id,
            env=self.task.env,
            messages=[*obs.messages, {"role": "assistant", "content": FILLER}],
            completion=FILLER,
            info=info,
        )
        score = await env.default_grader().grade(rollout, self.task)
        assert isinstance(score, Score), f"grade returned {type(score).__name__}, not Score"
        return f"score {score.value} ({score.status})"

    async def close(self) -> str:
        env, _ = await self.fresh()
        await env.close()
        await env.close()
        return "close() twice is fine"


async def check_env_async(
    env: str | Env | Callable[[], Env],
    *,
    seed: int = 0,
    n_tasks: int = 2,
    timeout_s: float = 60.0,
    max_steps: int = 64,
    **env_kwargs: Any,
) -> CheckReport:
    """`check_env` for callers already inside an event loop."""
    if isinstance(env, str):
        env_id = env

        def factory() -> Env:
            return make_env(env_id, **env_kwargs)
    elif isinstance(env, type) or (callable(env) and not hasattr(env, "step")):
        factory = env  # a class or factory function
    else:  # an instance: every "fresh" environment is the same object, reset again
        instance = env

        def factory() -> Env:
            return instance  # type: ignore[return-value]

    checker = _Checker(factory, seed, n_tasks, timeout_s, max_steps)
    checker.report.env_id = env if isinstance(env, str) else getattr(env, "env_id", "?")
    if not await checker.run("construct", checker.construct):
        return checker.report
    if not await checker.run("tasks", checker.tasks):
        return checker.report
    for check in ("reset", "step", "bad_actions", "step_after_done", "snapshot", "grader", "close"):
        await checker.run(check, getattr(checker, check))
    return checker.report


def check_env(env: str | Env | Callable[[], Env], **kwargs: Any) -> CheckReport:
    """Check an environment id, factory or instance; returns a `CheckReport` (see above).

    Keyword arguments other than `seed`, `n_tasks`, `timeout_s`, `max_steps` go to the
    factory. Safe to call from inside a running event loop (it then uses a thread).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(check_env_async(env, **kwargs))
    box: list[CheckReport] = []
    thread = threading.Thread(
        target=lambda: box.append(asyncio.run(check_env_async(env, **kwargs)))
    )
    thread.start()
    thread.join()
    return box[0]
