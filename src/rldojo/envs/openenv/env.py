"""openenv-v1: any running OpenEnv server as an rldojo environment, through OpenEnv's client.

    [env]
    id = "openenv-v1"
    kwargs = { base_url = "http://127.0.0.1:8000", tasks = 64 }
    # or: kwargs = { path = "envs/my_env", tasks = 64 }   (an `openenv init` directory)

The server is `base_url`, or the one this process starts from the environment directory
`path` (``uvicorn server.app:app`` in it, shared by every episode with that `path`,
stopped at exit; `rldojo.envs.openenv.server`).

Each episode opens its own session on the server with OpenEnv's `GenericEnvClient` (a
WebSocket; the server keeps the episode's state): `reset` sends the task's reset fields
and the reply becomes the opening conversation; each assistant turn is sent as the
server's action (its text in the action's string field, see `rldojo.envs.openenv.wire`)
and the observation becomes the next user message (or the user/tool messages a server
run by `rldojo env serve` sends); every step's reward is recorded, and the grader
(`OpenEnvRewardGrader`) turns them into the score. The episode ends when the server
says `done`, or after `max_turns` turns (`episode/limit` = turns, as multi-turn
environments report it).

MCP tool environments (`actions = "mcp_tools"`, or `"auto"` when the server's action is
OpenEnv's `CallToolAction`): the server's tools are listed at reset and shown to the
policy; each ``<tool_call>`` of a turn is sent as one `call_tool` action and comes back as
a ``tool`` message; an ``<answer>`` ends the episode if the server has not
(`rldojo.envs.openenv.tools`). Rewards are the server's, as in text mode.

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
from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from rldojo.envs.base import EpisodeDone
from rldojo.envs.kwargs import EnvKwargs, given_kwargs
from rldojo.envs.openenv.grader import OpenEnvRewardGrader
from rldojo.envs.openenv.server import shared_server
from rldojo.envs.openenv.tools import LIST_TOOLS, ToolTurns, listed_tools
from rldojo.envs.openenv.wire import (
    ServerReportedError,
    check_status,
    discover_action_field,
    fetch_schema,
    is_tool_action,
    observation_messages,
)
from rldojo.envs.registry import register
from rldojo.envs.tools import tools_prompt
from rldojo.types import Observation, StepResult, Task

__all__ = ["ENV_ID", "OpenEnvEnv", "OpenEnvKwargs"]

ENV_ID = "openenv-v1"


class _Reply(Protocol):
    """What OpenEnv's client returns for a reset or a step (its `StepResult`)."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


class _Session(Protocol):
    """The part of OpenEnv's `GenericEnvClient` an episode uses (one session)."""

    async def reset(self, **payload: object) -> _Reply: ...

    async def step(self, action: dict[str, Any]) -> _Reply: ...


class OpenEnvKwargs(EnvKwargs):
    """The kwargs of openenv-v1 (`[env] kwargs`)."""

    base_url: str | None = Field(None, pattern=r"^(https?|wss?)://")
    """The OpenEnv server, e.g. ``http://127.0.0.1:8000`` (its WebSocket is ``/ws``);
    exactly one of `base_url` and `path`."""
    path: str | None = None
    """An OpenEnv environment directory (with ``server/app.py``, as `openenv init`
    generates): its server is started here (``uvicorn server.app:app``) and shared by
    the process's episodes; exactly one of `base_url` and `path`."""
    start_timeout_s: float = Field(120.0, gt=0)
    """Seconds for `path`'s server to listen and answer ``/health``."""
    actions: Literal["auto", "text", "mcp_tools"] = "auto"
    """What a turn is sent as: ``text`` (one action with the turn in a string field),
    ``mcp_tools`` (each ``<tool_call>`` as an MCP `call_tool` action), ``auto``: MCP when
    the server's action schema is `CallToolAction` (and `action_field` is unset)."""
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
    """A system message put before the server's opening (None: none; with MCP tools the
    tool list follows it)."""
    schema_style: Literal["json", "signatures", "template"] = "json"
    """MCP tools in the system prompt: one JSON schema per line, one signature per tool,
    or only the call syntax (the chat template renders ``info["tools"]``)."""
    max_calls_per_turn: int = Field(8, gt=0)
    """MCP tool calls beyond this in one turn are refused (`too_many_calls`)."""
    max_result_chars: int = Field(4000, gt=0)
    """Longer MCP tool results are cut (the model is told they were)."""
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

    @model_validator(mode="after")
    def _one_server(self) -> OpenEnvKwargs:
        if (self.base_url is None) == (self.path is None):
            raise ValueError("openenv-v1: give exactly one of base_url and path")
        return self


class OpenEnvEnv:
    """An OpenEnv server's episodes as an rldojo `Env` (see the module docstring); built
    from `OpenEnvKwargs` (or keywords validated against it)."""

    Kwargs = OpenEnvKwargs
    env_id = ENV_ID

    def __init__(self, kwargs: OpenEnvKwargs | None = None, /, **keywords: object) -> None:
        self.kwargs = given_kwargs(ENV_ID, OpenEnvKwargs, kwargs, keywords)
        self._client: _Session | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._url = self.kwargs.base_url
        self._field: str | None = self.kwargs.action_field
        self._mode: Literal["text", "mcp_tools"] | None = None
        self._tools: ToolTurns | None = None
        self._rewards: list[float | None] = []
        self._status = "ok"
        self._turns = 0
        self._done = True

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        """Reset requests (module docstring); `seed` does not change them."""
        c = self.kwargs
        if split not in ("train", "test"):
            raise ValueError(f"{ENV_ID}: unknown split {split!r} (train or test)")
        count, first = (c.tasks, c.seed) if split == "train" else (c.test_tasks, c.seed + c.tasks)
        count = count if n is None else min(n, count)
        return [self._task(split, k, first + k) for k in range(count)]

    def _task(self, split: str, index: int, seed: int) -> Task:
        reset: dict[str, Any] = {**self.kwargs.reset_kwargs, "seed": seed}
        if self.kwargs.task_api:
            reset.update(split=split, index=index)
        prompt = f"OpenEnv episode {split}/{index} (reset seed {seed}); the server poses it"
        return Task(
            id=f"{ENV_ID}/{split}/{index}", prompt=prompt, info={"reset": reset}, env=ENV_ID
        )

    def default_grader(self) -> OpenEnvRewardGrader:
        where = self.kwargs.base_url or self.kwargs.path or ""
        return OpenEnvRewardGrader(self.kwargs.reward, where)

    async def _prepare(self) -> str:
        """The server's URL (starting `path`'s server, or finding it running) and, once,
        how turns are sent (`actions`; ``auto`` reads the server's ``/schema``)."""
        c = self.kwargs
        if c.path is not None:
            server = await asyncio.to_thread(shared_server, c.path, timeout_s=c.start_timeout_s)
            self._url = server.url
        assert self._url is not None
        if self._mode is None:
            tools = c.actions == "mcp_tools"
            if c.actions == "auto" and c.action_field is None:
                schema = await fetch_schema(self._url, c.connect_timeout_s)
                tools = is_tool_action(schema.get("action") or {})
            if not tools and self._field is None:
                self._field = await discover_action_field(self._url, c.connect_timeout_s)
            self._mode = "mcp_tools" if tools else "text"
        return self._url

    async def _connect(self, url: str) -> _Session:
        from openenv.core import GenericEnvClient

        c = self.kwargs
        self._stack = contextlib.AsyncExitStack()
        client = GenericEnvClient(
            base_url=url,
            connect_timeout_s=c.connect_timeout_s,
            message_timeout_s=c.message_timeout_s,
        )
        session: _Session = await self._stack.enter_async_context(client)
        self._client = session
        return session

    def _session(self) -> _Session:
        """The episode's open session."""
        if self._client is None:
            raise EpisodeDone(f"{ENV_ID}: no open session (reset first)")
        return self._client

    async def _open(self, payload: dict[str, Any]) -> _Reply:
        """Connect and reset; while the server is at capacity, close, back off and try
        again until `capacity_wait_s` has passed (the server refuses the session with
        an error frame, which OpenEnv's client raises as a `RuntimeError`)."""
        deadline = time.monotonic() + self.kwargs.capacity_wait_s
        delay = 0.02
        while True:
            url = await self._prepare()
            session = await self._connect(url)
            try:
                return await session.reset(**payload)
            except RuntimeError as exc:
                if "CAPACITY_REACHED" not in str(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise ConnectionError(
                        f"{url} stayed at capacity (its max_concurrent_envs) "
                        f"for {self.kwargs.capacity_wait_s:g}s (capacity_wait_s): {exc}"
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
        messages = observation_messages(result.observation, self.kwargs.observation_field)
        self._rewards, self._status, self._turns, self._done = [], "ok", 0, False
        info: dict[str, Any] = {"seed": seed}
        system = self.kwargs.system_prompt
        if self._mode == "mcp_tools":
            tools = await self._list_tools()
            prompt = tools_prompt(tools, style=self.kwargs.schema_style)
            system = f"{system}\n\n{prompt}" if system else prompt
            info["tools"] = [t.schema() for t in tools]
        elif result.observation.get("tools"):
            info["tools"] = result.observation["tools"]
        if system:
            messages = [{"role": "system", "content": system}, *messages]
        return Observation(messages=messages, info=info)

    async def _list_tools(self) -> list[Any]:
        """The session's tools (OpenEnv's `ListToolsAction`), and a fresh tool loop."""
        observation = (await self._session().step(LIST_TOOLS)).observation
        error = (observation.get("metadata") or {}).get("error")
        if "tools" not in observation or (error and not observation["tools"]):
            raise ServerReportedError(f"the server listed no tools: {error or observation}")
        tools = listed_tools(observation)
        c = self.kwargs
        self._tools = ToolTurns(
            tools, max_calls=c.max_calls_per_turn, max_result_chars=c.max_result_chars
        )
        return tools

    async def _send(self, action: dict[str, Any]) -> tuple[Mapping[str, Any], bool]:
        """One action on the session: its reward is recorded, a reported failure raised."""
        result = await self._session().step(action)
        self._status = check_status(result.observation)
        self._rewards.append(None if result.reward is None else float(result.reward))
        return result.observation, bool(result.done)

    async def step(self, action: str) -> StepResult:
        """Play one assistant turn: the server's action(s) and the observation(s) as the
        next messages."""
        if self._done or self._client is None:
            raise EpisodeDone(f"{ENV_ID}: step() after the episode ended (or before reset)")
        self._turns += 1
        observation: Mapping[str, Any] = {}
        if self._tools is not None and self._mode == "mcp_tools":
            messages, reason = await self._tools.play(action, self._send)
        else:
            assert self._field is not None
            observation, server_done = await self._send({self._field: action})
            reason = "server" if server_done else None
            messages = None
        cut = reason is None and self._turns >= self.kwargs.max_turns
        self._done = reason is not None or cut
        info = self._info(observation, cut, "limit" if cut else reason)
        if self._done:  # the session's server-side environment is freed at once
            await self.close()
            return StepResult(messages=[], done=True, info=info)
        if messages is None:
            messages = observation_messages(observation, self.kwargs.observation_field)
        return StepResult(messages=messages, done=False, info=info)

    def _info(
        self, observation: Mapping[str, Any], cut: bool, reason: str | None
    ) -> dict[str, Any]:
        """The running totals every step repeats (the engine keeps the latest)."""
        error = observation.get("error")
        info: dict[str, Any] = {
            "openenv/rewards": list(self._rewards),
            "openenv/status": self._status,
            "openenv/error": error if isinstance(error, str) else "",
            "episode/turns": self._turns,
            "episode/limit": "turns" if cut else None,
            "episode/done_reason": reason if self._done else None,
        }
        if isinstance(observation.get("score"), dict):
            info["openenv/score"] = observation["score"]
        if self._tools is not None and self._mode == "mcp_tools":
            info.update(self._tools.info())
        return info

    async def close(self) -> None:
        """Close the session (the server frees its environment); safe to call twice."""
        stack, self._stack, self._client, self._done = self._stack, None, None, True
        if stack is not None:
            await stack.aclose()


register(ENV_ID, OpenEnvEnv)
