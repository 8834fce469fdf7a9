"""One episode of an rldojo environment, played by a caller outside rldojo.

A server for another project's protocol (OpenEnv: `rldojo.interop.openenv_server`) holds
one `ServedEpisode` per client session: `reset` picks a task and returns the opening
conversation, each `step` takes one assistant turn as text and returns the environment's
reply, and the turn that ends the episode is graded by the environment's own grader
(`default_grader`), as rldojo's rollout engine grades it. What crosses the boundary is a
`Reply`: plain JSON-safe data, whatever the protocol.

Failures are statuses, never a reward of 0 (`Reply.reward` is None unless a grader
scored the episode):

    ok             the turn was played; at the end, `reward` is the grader's score
    truncated      the episode hit `max_turns`; it is still graded (as rldojo grades a
                   truncated rollout)
    env_error      the environment raised (or a step came before reset / after the end)
    timeout        the environment took longer than `step_timeout_s`
    invalid        the request named no usable task (unknown split, index out of range,
                   a task without a prompt)
    grade_<s>      the grader failed with status <s> (`grade_error`, `grade_timeout`,
                   `grade_invalid`); `error` says why

Any status other than `ok` ends the episode (`done` is True).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rldojo.envs.base import Env
from rldojo.envs.registry import build_env, resolve_factory
from rldojo.rollout.episodes import grade_rollouts
from rldojo.types import Message, Rollout, Score, Task

__all__ = ["Reply", "ServedEnvSpec", "ServedEpisode", "TaskBook", "json_safe"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedEnvSpec:
    """Which environment a server plays and the bounds of every episode it serves."""

    env_id: str
    """A registered id (``arith-v1``) or a ``package.module:factory`` path."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """The factory's keyword arguments (checked against its `Kwargs` model)."""
    task_seed: int = 0
    """The seed of the task lists (`Env.tasks(split, seed=task_seed)`) a reset picks from."""
    step_timeout_s: float = 60.0
    """Seconds one `reset` or `step` of the environment may take (status `timeout`)."""
    grade_timeout_s: float = 60.0
    """Seconds the grader may take at the end of an episode (status `grade_timeout`)."""
    max_turns: int = 64
    """Turns after which an episode that has not ended is cut (status `truncated`)."""

    def make(self) -> Env:
        """A fresh environment (`EnvKwargsError` or `UnknownEnvError` when it cannot be)."""
        return build_env(self.env_id, resolve_factory(self.env_id), dict(self.kwargs))


def json_safe(value: object) -> Any:
    """`value` as plain JSON data (anything JSON cannot hold becomes its `str`)."""
    return json.loads(json.dumps(value, default=str))


class TaskBook:
    """The tasks of each split of one environment, built once and shared by the sessions
    of a server (a reset picks one by index or seed; the task API lists them)."""

    def __init__(self, spec: ServedEnvSpec) -> None:
        self.spec = spec
        self._probe: Env | None = None
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: str) -> list[Task]:
        """The tasks of `split` (`ValueError` for a split the environment does not have)."""
        if split not in self._tasks:
            if self._probe is None:
                self._probe = self.spec.make()
            self._tasks[split] = list(self._probe.tasks(split, seed=self.spec.task_seed))
        return self._tasks[split]

    def pick(self, split: str, index: int | None, seed: int) -> Task:
        """Task `index` of `split`, or the task `seed` selects (`seed mod len`) when no
        index is given; `IndexError` when out of range, `ValueError` for an empty split."""
        tasks = self.tasks(split)
        if not tasks:
            raise ValueError(f"split {split!r} has no tasks")
        if index is None:
            return tasks[seed % len(tasks)]
        if not 0 <= index < len(tasks):
            raise IndexError(
                f"task index {index} is out of range for {split!r} (0..{len(tasks) - 1})"
            )
        return tasks[index]

    def describe(self, split: str, index: int) -> dict[str, Any]:
        """A task as the task API shows it: id, split, index and prompt (no reference
        answer, no grading data: the client is the policy)."""
        task = self.tasks(split)[index]
        prompt = task.prompt if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]
        return {"id": task.id, "split": split, "index": index, "prompt": prompt}


@dataclass(frozen=True)
class Reply:
    """What one reset or step gives the caller (see the module docstring for `status`)."""

    messages: list[Message]
    """New conversation messages: the opening at reset, the environment's reply after."""
    done: bool = False
    reward: float | None = None
    """The grader's score on the turn that ended the episode; None otherwise."""
    status: str = "ok"
    error: str = ""
    task_id: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tool schemas of a tool environment (at reset)."""
    score: dict[str, Any] | None = None
    """At the end: the grader's value, status, components and explanation."""
    info: dict[str, Any] = field(default_factory=dict)
    """The environment's step info (JSON-safe)."""


def task_from_dict(data: Mapping[str, Any], env_id: str) -> Task:
    """A caller's own task (``{"prompt": ..., "answer": ..., "id": ..., "info": {...}}``);
    `ValueError` when it has no prompt."""
    prompt = data.get("prompt")
    if not (isinstance(prompt, str) and prompt) and not (
        isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt) and prompt
    ):
        raise ValueError("a task needs a 'prompt': a string or a list of chat messages")
    answer = data.get("answer")
    return Task(
        id=str(data.get("id") or "custom"),
        prompt=prompt,
        answer=None if answer is None else str(answer),
        info=dict(data.get("info") or {}),
        env=env_id,
    )


class ServedEpisode:
    """One session's episodes of one environment (a new `reset` starts another)."""

    def __init__(self, spec: ServedEnvSpec, book: TaskBook) -> None:
        self.spec, self.book = spec, book
        self.env: Env | None = None
        self.task: Task | None = None
        self.messages: list[Message] = []
        self.info: dict[str, Any] = {}
        self.turns = 0
        self.done = True
        self.status = "ok"

    async def reset(
        self,
        *,
        seed: int | None = None,
        split: str = "train",
        index: int | None = None,
        task: Mapping[str, Any] | None = None,
    ) -> Reply:
        """Start an episode on the caller's `task`, else on task `index` of `split`, else on
        the task `seed` selects; `seed` (default 0) also seeds the environment."""
        await self.close()
        self.messages, self.info, self.turns, self.done = [], {}, 0, False
        self.task = None
        try:
            chosen = (
                task_from_dict(task, self.spec.env_id)
                if task is not None
                else self.book.pick(split, index, seed or 0)
            )
        except (ValueError, IndexError, TypeError) as exc:  # the caller's request
            return self._end("invalid", f"{type(exc).__name__}: {exc}")
        self.task = chosen
        try:
            self.env = self.spec.make()
            obs = await asyncio.wait_for(
                self.env.reset(chosen, seed=seed or 0), self.spec.step_timeout_s
            )
        except Exception as exc:
            return self._failed(exc, "reset")
        self.messages = [dict(m) for m in obs.messages]
        tools = json_safe(list(obs.info.get("tools") or []))
        return Reply(list(self.messages), task_id=chosen.id, tools=tools)

    async def step(self, text: str) -> Reply:
        """Play one assistant turn; grade the episode when it ends."""
        if self.env is None or self.task is None:
            return self._end(
                "env_error",
                "step() before reset() (an HTTP /step builds a "
                "fresh environment per request: play episodes over the WebSocket)",
            )
        if self.done:
            return self._end("env_error", "step() after the episode ended; reset first")
        self.messages.append({"role": "assistant", "content": text})
        self.turns += 1
        try:
            result = await asyncio.wait_for(self.env.step(text), self.spec.step_timeout_s)
        except Exception as exc:
            return self._failed(exc, "step")
        self.info.update(result.info)
        reply = [dict(m) for m in result.messages]
        if not result.done and self.turns < self.spec.max_turns:
            self.messages.extend(reply)
            return Reply(reply, task_id=self.task.id, info=json_safe(dict(result.info)))
        self.done = True
        truncated = not result.done
        score = await self._grade("truncated" if truncated else "ok")
        return self._graded(score, truncated)

    async def _grade(self, status: str) -> Score:
        assert self.env is not None and self.task is not None
        last = next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")
        rollout = Rollout(
            task_id=self.task.id,
            env=self.task.env or self.spec.env_id,
            messages=list(self.messages),
            completion=last,
            status=status,  # type: ignore[arg-type]
            info=dict(self.info),
        )
        (score,) = await grade_rollouts(
            self.env.default_grader(), [rollout], [self.task], timeout_s=self.spec.grade_timeout_s
        )
        return score

    def _graded(self, score: Score, truncated: bool) -> Reply:
        assert self.task is not None
        summary = json_safe(
            {
                "value": score.value,
                "status": score.status,
                "components": dict(score.components),
                "explanation": score.explanation,
            }
        )
        info = json_safe(self.info)
        if not score.ok:
            self.status = f"grade_{score.status}"
            return Reply(
                [],
                True,
                None,
                self.status,
                score.explanation,
                self.task.id,
                score=summary,
                info=info,
            )
        self.status = "truncated" if truncated else "ok"
        return Reply([], True, score.value, self.status, "", self.task.id, score=summary, info=info)

    def _failed(self, exc: BaseException, what: str) -> Reply:
        if isinstance(exc, TimeoutError):
            why = f"{what} took longer than {self.spec.step_timeout_s:g}s"
            return self._end("timeout", f"{self.spec.env_id}: {why}")
        return self._end(
            "env_error", f"{self.spec.env_id}: {what} raised {type(exc).__name__}: {exc}"
        )

    def _end(self, status: str, error: str) -> Reply:
        self.done, self.status = True, status
        task_id = self.task.id if self.task is not None else ""
        return Reply([], True, None, status, " ".join(error.split())[:2000], task_id)

    async def close(self) -> None:
        """Close the environment of the current episode (if any); safe to call twice. A
        close that fails is logged, not raised: the episode is over either way, and the
        session's next reset must not fail for it."""
        env, self.env = self.env, None
        if env is None:
            return
        try:
            await asyncio.wait_for(env.close(), self.spec.step_timeout_s)
        except Exception as exc:
            log.warning("%s: close() raised %s: %s", self.spec.env_id, type(exc).__name__, exc)
