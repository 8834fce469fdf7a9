"""Any rldojo environment as an OpenEnv server, built on OpenEnv's own server classes.

    handle = start_env_server(ServedEnvSpec("arith-v1"), port=0)   # a thread, a free port
    # OpenEnv's client:  GenericEnvClient(base_url=handle.url) -> reset / step / state
    handle.close()

`rldojo env serve ID` runs `serve_env_forever`. The app is OpenEnv's (`create_app`, its
`HTTPEnvServer` behind it), so the wire protocol is OpenEnv's: a WebSocket session at
``/ws`` per client (one rldojo environment each, `RldojoEnvironment`), plus ``/health``,
``/schema``, ``/metadata``, ``/state`` and the task API (``/{env_id}/splits``, ``/tasks``,
``/num_tasks``, ``/task``, ``/task_range``). The episode itself is
`rldojo.interop.served_episode.ServedEpisode`:

- ``reset(seed=, split=, index=, task=)`` -> the opening conversation in
  `RldojoObservation.messages` (system prompt included) and the tool schemas in `tools`;
- ``step({"message": text, "tool_calls": [...]})`` -> the environment's reply (user or tool
  messages); structured tool calls are written into the turn as ``<tool_call>`` tags,
  the syntax rldojo's tool environments read;
- the turn that ends the episode carries ``reward`` = the grader's score and the score's
  components in `score`; a failure is `status`/`error`, with ``reward`` None.

OpenEnv's stateless HTTP ``/reset`` and ``/step`` build a fresh environment per request
(OpenEnv's design), so an episode over HTTP ends at its reset: play episodes over the
WebSocket, as OpenEnv's `EnvClient` does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import BaseModel, Field

from rldojo.interop.served_episode import Reply, ServedEnvSpec, ServedEpisode, TaskBook
from rldojo.interop.serving import AppHandle, run_until_stopped, start_app

__all__ = [
    "RldojoAction",
    "RldojoEnvironment",
    "RldojoObservation",
    "RldojoState",
    "build_app",
    "serve_env_forever",
    "start_env_server",
]

T = TypeVar("T")
CLOSE_TIMEOUT_S = 30.0
"""How long a session's end waits for its environment to close."""


class ToolCallSpec(BaseModel):
    """One tool call given as data (OpenAI's function-call shape)."""

    name: str = Field(description="The tool's name")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Its arguments")


class RldojoAction(Action):
    """One assistant turn: its text, and any tool calls given as data."""

    message: str = Field(default="", description="The assistant's text for this turn")
    tool_calls: list[ToolCallSpec] = Field(
        default_factory=list, description="Tool calls, appended to the text as <tool_call> tags"
    )

    def text(self) -> str:
        """The turn as rldojo's environments read it."""
        from json import dumps

        calls = [
            f"<tool_call>{dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>"
            for c in self.tool_calls
        ]
        return "\n".join([self.message, *calls]) if calls else self.message


class RldojoObservation(Observation):
    """The environment's side of one reset or step (`done`, `reward` are OpenEnv's)."""

    messages: list[dict[str, str]] = Field(
        default_factory=list,
        description="New chat messages: the opening conversation at reset, then the "
        "environment's reply (user or tool messages)",
    )
    status: str = Field(
        default="ok",
        description="ok, truncated, env_error, timeout, invalid, or grade_<status>; "
        "anything but ok/truncated means no reward",
    )
    error: str = Field(default="", description="Why, when status is a failure")
    task_id: str = Field(default="", description="The id of the episode's task")
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="Tool schemas of a tool environment (at reset)"
    )
    score: dict[str, Any] | None = Field(
        default=None, description="At the end: the grader's value, status, components, why"
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's step info")


class RldojoState(State):
    """What `state` reports about a session's episode (read-only: no restore over the wire)."""

    env_id: str = ""
    task_id: str = ""
    turns: int = 0
    done: bool = True
    status: str = "ok"


def _observation(reply: Reply) -> RldojoObservation:
    return RldojoObservation(
        messages=reply.messages,
        status=reply.status,
        error=reply.error,
        task_id=reply.task_id,
        tools=reply.tools,
        score=reply.score,
        info=reply.info,
        done=reply.done,
        reward=reply.reward,
    )


def _run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to the end from synchronous code (OpenEnv's sync `reset`/`step`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("inside an event loop: call reset_async / step_async")


_closing: set[asyncio.Task[None]] = set()
"""Closes scheduled on a running loop, kept referenced until they finish."""


class RldojoEnvironment(Environment[RldojoAction, RldojoObservation, RldojoState]):
    """One client session: an rldojo environment behind OpenEnv's `Environment` contract.

    The async methods are the ones OpenEnv's server calls; the episode runs on the
    server's event loop. The environment itself is built at `reset`, so a session that
    only asks for tasks or metadata builds nothing.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own environment

    def __init__(self, spec: ServedEnvSpec, book: TaskBook) -> None:
        super().__init__()
        self.spec, self.book = spec, book
        self.episode = ServedEpisode(spec, book)
        self._episode_id = ""
        self._loop: asyncio.AbstractEventLoop | None = None

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        split: str = "train",
        index: int | None = None,
        task: dict[str, Any] | None = None,
        **_ignored: Any,
    ) -> RldojoObservation:
        """Start an episode: the caller's `task`, else task `index` of `split`, else the
        task `seed` selects (other reset fields, e.g. a dataset row's, are ignored)."""
        self._loop = asyncio.get_running_loop()
        self._episode_id = episode_id or uuid.uuid4().hex
        reply = await self.episode.reset(seed=seed, split=split, index=index, task=task)
        return _observation(reply)

    async def step_async(
        self, action: RldojoAction, timeout_s: float | None = None, **_ignored: Any
    ) -> RldojoObservation:
        """Play one assistant turn (`timeout_s` is ignored: the server's bound applies)."""
        return _observation(await self.episode.step(action.text()))

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> RldojoObservation:
        return _run_blocking(self.reset_async(seed, episode_id, **kwargs))

    def step(
        self, action: RldojoAction, timeout_s: float | None = None, **kwargs: Any
    ) -> RldojoObservation:
        return _run_blocking(self.step_async(action, timeout_s))

    @property
    def state(self) -> RldojoState:
        ep = self.episode
        return RldojoState(
            episode_id=self._episode_id or None,
            step_count=ep.turns,
            env_id=self.spec.env_id,
            task_id=ep.task.id if ep.task else "",
            turns=ep.turns,
            done=ep.done,
            status=ep.status,
        )

    def close(self) -> None:
        """Close the episode's environment on the loop it ran on: OpenEnv calls this from
        the session's executor thread (WebSocket) or from the loop itself (HTTP)."""
        coro = self.episode.close()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            task = running.create_task(coro)
            _closing.add(task)
            task.add_done_callback(_closing.discard)
        elif self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(coro, self._loop).result(CLOSE_TIMEOUT_S)
        else:
            asyncio.run(coro)

    def get_metadata(self) -> EnvironmentMetadata:
        from importlib.metadata import version

        return EnvironmentMetadata(
            name=self.spec.env_id,
            description=f"rldojo environment {self.spec.env_id}, served by `rldojo env serve`",
            version=version("rldojo"),
        )

    # ------------------------------------------------ OpenEnv's task API (TaskProvider)

    def list_splits(self) -> list[str]:
        return ["train", "test"]

    def num_tasks(self, split: str) -> int:
        return len(self.book.tasks(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self.book.tasks(split)):
            raise IndexError(index)
        return self.book.describe(split, index)

    def get_task_range(
        self, split: str, start: int | None = None, stop: int | None = None
    ) -> list[dict[str, Any]]:
        indices = range(len(self.book.tasks(split)))[start:stop]
        return [self.book.describe(split, i) for i in indices]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return self.get_task_range(split)


def build_app(spec: ServedEnvSpec, *, max_sessions: int = 64) -> Any:
    """OpenEnv's FastAPI app over `spec`'s environment. The task list of ``train`` is
    built here, so bad kwargs or an unknown id fail now, in one line."""
    book = TaskBook(spec)
    book.tasks("train")
    factory: Callable[[], RldojoEnvironment] = partial(RldojoEnvironment, spec, book)
    return create_app(
        factory,
        RldojoAction,
        RldojoObservation,
        env_name=spec.env_id,
        max_concurrent_envs=max_sessions,
        state_cls=RldojoState,
    )


def start_env_server(
    spec: ServedEnvSpec, host: str = "127.0.0.1", port: int = 0, *, max_sessions: int = 64
) -> AppHandle:
    """Serve `spec` in a daemon thread; returns once it listens (port 0: a free port). The
    port is bound first, so a port in use fails before the environment is built."""
    return start_app(
        lambda: build_app(spec, max_sessions=max_sessions), host, port, name="rldojo-env-serve"
    )


def serve_env_forever(
    spec: ServedEnvSpec,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    max_sessions: int = 64,
    on_ready: Callable[[AppHandle], None] | None = None,
) -> None:
    """Serve until Ctrl-C or SIGTERM (what `rldojo env serve` runs)."""
    run_until_stopped(start_env_server(spec, host, port, max_sessions=max_sessions), on_ready)
