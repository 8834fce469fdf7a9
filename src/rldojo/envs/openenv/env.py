"""openenv-v1: any running OpenEnv server as an rldojo environment, through OpenEnv's client.

    [env]
    id = "openenv-v1"
    kwargs = { base_url = "http://127.0.0.1:8000", tasks = 64 }

Each episode opens its own session on the server with OpenEnv's `GenericEnvClient` (a
WebSocket; the server keeps the episode's state): `reset` sends the task's reset fields
and the reply becomes the opening conversation; each assistant turn is sent as the
server's action (its text in the action's string field, see `rldojo.envs.openenv.wire`)
and the observation becomes the next user message (or the user/tool messages a server
run by `rldojo env serve` sends); every step's reward is recorded, and the grader
(`OpenEnvRewardGrader`) turns them into the score. The episode ends when the server
says `done`, or after `max_turns` turns (`episode/limit` = turns, as multi-turn
environments report it).

Tasks: an OpenEnv server poses its own tasks at reset, so a task here is a reset
request: task ``k`` of ``train`` resets with seed ``seed + k``, task ``k`` of ``test`` with
``seed + tasks + k`` (the splits never share a seed). With `task_api`, the reset also names
the split and index (OpenEnv's task API, which `rldojo env serve` implements). The task
list depends on the kwargs only, not on the `seed` argument of `tasks`.

Failures are the rollout engine's statuses, never a reward of 0: a server that cannot be
reached or that drops the connection raises (`env_error`); a reply later than
`message_timeout_s` raises `TimeoutError` (`timeout`); a failure the server reports in
rldojo's ``status`` field is raised the same way.

Needs the `openenv` package (``pip install 'rldojo[openenv]'``), imported at the first
reset so that listing environments stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from rldojo.envs.base import EpisodeDone
from rldojo.envs.kwargs import EnvKwargs
from rldojo.envs.openenv.grader import OpenEnvRewardGrader
from rldojo.envs.openenv.wire import (
    check_status,
    discover_action_field,
    observation_messages,
)
from rldojo.envs.registry import register
from rldojo.types import Observation, StepResult, Task

__all__ = ["ENV_ID", "OpenEnvEnv", "OpenEnvKwargs"]

ENV_ID = "openenv-v1"


class OpenEnvKwargs(EnvKwargs):
    """The kwargs of openenv-v1 (`[env] kwargs`)."""

    base_url: str = Field(pattern=r"^(https?|wss?)://")
    """The OpenEnv server, e.g. ``http://127.0.0.1:8000`` (its WebSocket is ``/ws``)."""
    tasks: int = Field(100, gt=0)
    """Episodes of the train split (reset seeds ``seed .. seed + tasks - 1``)."""
    test_tasks: int = Field(20, ge=0)
    """Episodes of the test split (the seeds after the train split's)."""
    seed: int = Field(0, ge=0)
    """Reset seed of the first train episode."""
    task_api: bool = False
    """Also send ``split`` and ``index`` at reset (OpenEnv's task API, e.g. a server run
    by `rldojo env serve`); off: the seed alone picks the episode."""
    reset_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra fields sent with every reset (the server's own reset options)."""
    action_field: str | None = None
    """The action field the assistant's text goes in; None: the action schema's only
    string field (read from the server's ``/schema``)."""
    observation_field: str | None = None
    """The observation field shown to the policy; None: the ``messages`` a server run by
    `rldojo env serve` sends, else the only string field, else all fields as JSON."""
    system_prompt: str | None = None
    """A system message put before the server's opening (None: none)."""
    reward: Literal["sum", "last"] = "sum"
    """The score: the sum of the episode's rewards (its return) or the last one given."""
    max_turns: int = Field(8, gt=0)
    """Turns after which an episode the server has not ended is cut."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Seconds to open the connection (and to read ``/schema``)."""
    message_timeout_s: float = Field(60.0, gt=0)
    """Seconds to wait for the server's reply to a reset or step (status `timeout`)."""
    capacity_wait_s: float = Field(20.0, ge=0)
    """Seconds a reset waits for a free session while the server is at capacity (its
    `max_concurrent_envs`), retrying with backoff; then `env_error`."""


class OpenEnvEnv:
    """An OpenEnv server's episodes as an rldojo `Env` (see the module docstring); its
    arguments: `OpenEnvKwargs`."""

    Kwargs = OpenEnvKwargs
    env_id = ENV_ID

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        self.config = OpenEnvKwargs(base_url=base_url, **kwargs)
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._field: str | None = self.config.action_field
        self._rewards: list[float | None] = []
        self._turns = 0
        self._done = True

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        """Reset requests (module docstring); `seed` does not change them."""
        c = self.config
        if split not in ("train", "test"):
            raise ValueError(f"{ENV_ID}: unknown split {split!r} (train or test)")
        count, first = (c.tasks, c.seed) if split == "train" else (c.test_tasks, c.seed + c.tasks)
        count = count if n is None else min(n, count)
        return [self._task(split, k, first + k) for k in range(count)]

    def _task(self, split: str, index: int, seed: int) -> Task:
        reset: dict[str, Any] = {**self.config.reset_kwargs, "seed": seed}
        if self.config.task_api:
            reset.update(split=split, index=index)
        prompt = f"OpenEnv episode {split}/{index} (reset seed {seed}); the server poses it"
        return Task(id=f"{ENV_ID}/{split}/{index}", prompt=prompt, info={"reset": reset},
                    env=ENV_ID)  # fmt: skip

    def default_grader(self) -> OpenEnvRewardGrader:
        return OpenEnvRewardGrader(self.config.reward, self.config.base_url)

    async def _connect(self) -> None:
        from openenv.core import GenericEnvClient

        c = self.config
        if self._field is None:
            self._field = await discover_action_field(c.base_url, c.connect_timeout_s)
        self._stack = contextlib.AsyncExitStack()
        client = GenericEnvClient(
            base_url=c.base_url,
            connect_timeout_s=c.connect_timeout_s,
            message_timeout_s=c.message_timeout_s,
        )
        self._client = await self._stack.enter_async_context(client)

    async def _open(self, payload: dict[str, Any]) -> Any:
        """Connect and reset; while the server is at capacity, close, back off and try
        again until `capacity_wait_s` has passed (the server refuses the session with
        an error frame, which OpenEnv's client raises as a `RuntimeError`)."""
        deadline = time.monotonic() + self.config.capacity_wait_s
        delay = 0.02
        while True:
            await self._connect()
            try:
                return await self._client.reset(**payload)
            except RuntimeError as exc:
                if "CAPACITY_REACHED" not in str(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise ConnectionError(
                        f"{self.config.base_url} stayed at capacity (its max_concurrent_envs) "
                        f"for {self.config.capacity_wait_s:g}s (capacity_wait_s): {exc}"
                    ) from exc
            await self.close()
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def reset(self, task: Task, *, seed: int) -> Observation:
        """Open a session and reset it with the task's reset fields (`seed` is the
        rollout's sampling seed; the task's reset seed picks the episode)."""
        await self.close()
        result = await self._open(dict(task.info.get("reset") or {"seed": seed}))
        check_status(result.observation)
        messages = observation_messages(result.observation, self.config.observation_field)
        if self.config.system_prompt:
            messages = [{"role": "system", "content": self.config.system_prompt}, *messages]
        self._rewards, self._turns, self._done = [], 0, False
        info: dict[str, Any] = {"seed": seed}
        tools = result.observation.get("tools")
        if tools:
            info["tools"] = tools
        return Observation(messages=messages, info=info)

    async def step(self, action: str) -> StepResult:
        """Send one assistant turn as the server's action; its observation is the reply."""
        if self._done or self._client is None:
            raise EpisodeDone(f"{ENV_ID}: step() after the episode ended (or before reset)")
        assert self._field is not None
        result = await self._client.step({self._field: action})
        self._turns += 1
        status = check_status(result.observation)
        reward = None if result.reward is None else float(result.reward)
        self._rewards.append(reward)
        cut = not result.done and self._turns >= self.config.max_turns
        self._done = bool(result.done) or cut
        info = self._info(result.observation, status, cut)
        if self._done:  # the session's server-side environment is freed at once
            await self.close()
            return StepResult(messages=[], done=True, info=info)
        messages = observation_messages(result.observation, self.config.observation_field)
        return StepResult(messages=messages, done=False, info=info)

    def _info(self, observation: Mapping[str, Any], status: str, cut: bool) -> dict[str, Any]:
        """The running totals every step repeats (the engine keeps the latest)."""
        info: dict[str, Any] = {
            "openenv/rewards": list(self._rewards),
            "openenv/status": status,
            "openenv/error": str(observation.get("error") or ""),
            "episode/turns": self._turns,
            "episode/limit": "turns" if cut else None,
            "episode/done_reason": ("limit" if cut else "server") if self._done else None,
        }
        if isinstance(observation.get("score"), dict):
            info["openenv/score"] = observation["score"]
        return info

    async def close(self) -> None:
        """Close the session (the server frees its environment); safe to call twice."""
        stack, self._stack, self._client, self._done = self._stack, None, None, True
        if stack is not None:
            await stack.aclose()


register(ENV_ID, OpenEnvEnv)
