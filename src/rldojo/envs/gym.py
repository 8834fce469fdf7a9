"""Gymnasium adapter: any rldojo environment as a `gymnasium.Env` with text spaces.

    env = to_gymnasium("tictactoe-v1", opponent_depth=2)
    obs, info = env.reset(seed=0)              # obs: the opening conversation as text
    obs, reward, terminated, truncated, info = env.step("<move>5</move>")

Observations and actions are `gymnasium.spaces.Text` over printable ASCII (characters
outside it are replaced by ``?`` in observations). `reset` draws a task from the
environment's split with the seeded ``np_random`` (or takes ``options={"task_index": i}``)
and returns the rendered opening messages; `step` returns the rendered environment
replies. The reward is 0.0 until the episode ends, then the value of the environment's
default grader on the whole episode; a grader failure gives 0.0 with
``info["score_status"]`` saying why (gymnasium has no "no reward"). `truncated` is True
when an episode limit (turns, tokens, wall time) ended it. The structured messages are
in ``info["messages"]``. rldojo environments are async; each adapter runs them on its
own event loop, so it must not be called from inside a running loop.

`register_gymnasium()` also makes every rldojo id available as ``gymnasium.make("rldojo/<id>")``.
"""

from __future__ import annotations

import asyncio
import copy
import string
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium import spaces

from rldojo.envs.base import Env, EpisodeDone
from rldojo.envs.registry import list_envs, make_env
from rldojo.graders.base import Grader
from rldojo.types import Message, Rollout, Task

__all__ = ["CHARSET", "TextEnv", "register_gymnasium", "render_messages", "to_gymnasium"]

CHARSET = frozenset(string.printable)
"""Characters of the text spaces: printable ASCII and whitespace."""
MAX_OBSERVATION_CHARS = 200_000
MAX_ACTION_CHARS = 4096


def render_messages(messages: Sequence[Message], max_chars: int = MAX_OBSERVATION_CHARS) -> str:
    """Messages as ``[role]\\ncontent`` blocks, limited to `CHARSET` and the last `max_chars`."""
    text = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
    text = "".join(ch if ch in CHARSET else "?" for ch in text)
    return text[-max_chars:]


class TextEnv(gymnasium.Env[str, str]):
    """An rldojo `Env` behind the gymnasium API (see the module docstring).

    Args:
        env: the rldojo environment.
        split: which task split `reset` draws from.
        task_seed: seed of the task list (`Env.tasks(split, seed=task_seed, n=n_tasks)`).
        n_tasks: how many tasks to draw from (None: the environment's default).
        render_mode: None or ``"ansi"`` (the conversation so far as text).
    """

    metadata = {"render_modes": ["ansi"]}  # noqa: RUF012 (gymnasium's own declaration)

    def __init__(
        self,
        env: Env,
        *,
        split: str = "train",
        task_seed: int = 0,
        n_tasks: int | None = 64,
        render_mode: str | None = None,
    ) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.env = env
        self.render_mode = render_mode
        self.tasks: list[Task] = list(env.tasks(split, seed=task_seed, n=n_tasks))
        if not self.tasks:
            raise ValueError(f"{env.env_id}: split {split!r} has no tasks")
        self.observation_space = spaces.Text(MAX_OBSERVATION_CHARS, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(MAX_ACTION_CHARS, min_length=0, charset=CHARSET)
        self._loop = asyncio.new_event_loop()
        self._grader: Grader | None = None
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._info: dict[str, Any] = {}
        self._seed = 0
        self._done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        index = options.get("task_index")
        if index is None:
            index = int(self.np_random.integers(len(self.tasks)))
        self._task = self.tasks[int(index) % len(self.tasks)]
        self._seed = int(self.np_random.integers(2**31 - 1))
        obs = self._loop.run_until_complete(self.env.reset(self._task, seed=self._seed))
        self._messages = [dict(m) for m in obs.messages]
        self._info, self._done = {}, False
        info = {"task_id": self._task.id, "seed": self._seed, "messages": self._copy_messages()}
        return render_messages(obs.messages), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self._task is None:
            raise EpisodeDone(f"{self.env.env_id}: step() after the episode ended; call reset()")
        result = self._loop.run_until_complete(self.env.step(action))
        self._messages.append({"role": "assistant", "content": action})
        self._messages.extend(dict(m) for m in result.messages)
        self._info.update(copy.deepcopy(dict(result.info)))
        info: dict[str, Any] = copy.deepcopy(dict(result.info))
        info["messages"] = self._copy_messages()
        reward, truncated = 0.0, False
        if result.done:
            self._done = True
            truncated = self._info.get("episode/limit") is not None
            reward = self._grade(action, truncated, info)
        return (
            render_messages(result.messages),
            reward,
            bool(result.done and not truncated),
            truncated,
            info,
        )

    def _grade(self, completion: str, truncated: bool, info: dict[str, Any]) -> float:
        assert self._task is not None
        if self._grader is None:
            self._grader = self.env.default_grader()
        rollout = Rollout(
            task_id=self._task.id,
            env=self._task.env or self.env.env_id,
            messages=self._copy_messages(),
            completion=completion,
            status="truncated" if truncated else "ok",
            seed=self._seed,
            info=copy.deepcopy(self._info),
        )
        try:
            score = self._loop.run_until_complete(self._grader.grade(rollout, self._task))
        except Exception as exc:  # a broken grader is reported, not raised into the agent loop
            info["score_status"] = "error"
            info["score_explanation"] = f"{type(exc).__name__}: {exc}"
            return 0.0
        info["score_status"] = score.status
        info["score_components"] = dict(score.components)
        info["score_explanation"] = score.explanation
        return float(score.value) if score.value is not None else 0.0

    def _copy_messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self._messages]

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return render_messages(self._messages)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self.env.close())
        finally:
            self._loop.close()


def to_gymnasium(
    env: str | Env,
    *,
    split: str = "train",
    task_seed: int = 0,
    n_tasks: int | None = 64,
    render_mode: str | None = None,
    **env_kwargs: object,
) -> TextEnv:
    """A `gymnasium.Env` for an rldojo environment id (built with `env_kwargs`) or instance."""
    instance = make_env(env, **env_kwargs) if isinstance(env, str) else env
    return TextEnv(
        instance, split=split, task_seed=task_seed, n_tasks=n_tasks, render_mode=render_mode
    )


def register_gymnasium(namespace: str = "rldojo") -> list[str]:
    """Register every rldojo environment with gymnasium as ``<namespace>/<id>``; returns the ids."""
    registered = []
    for env_id in list_envs():
        gym_id = f"{namespace}/{env_id}"
        if gym_id not in gymnasium.registry:
            gymnasium.register(
                gym_id,
                entry_point="rldojo.envs.gym:to_gymnasium",
                kwargs={"env": env_id},
                disable_env_checker=True,
            )
        registered.append(gym_id)
    return registered
