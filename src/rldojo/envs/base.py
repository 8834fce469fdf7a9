"""The `Env` protocol: the contract between environments and the rollout engine.

An environment holds the state of one episode. `reset(task, seed=...)` starts an episode
and returns the opening conversation; `step(action)` takes the policy's text for one turn
and returns the environment's reply and whether the episode is over. Both are async
because real environments wait on subprocesses, sandboxes and databases.

Single-turn environments end on the first `step`. Multi-turn environments (tools, games,
code repair) return messages to append and `done=False` until they finish. Every
environment names its grader: `default_grader()` returns the grader that scores a
finished rollout of this environment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from rldojo.types import Observation, Rollout, StepResult, Task

if TYPE_CHECKING:
    from rldojo.graders.base import Grader


@runtime_checkable
class Env(Protocol):
    """An environment: tasks, episode state, and the grader of its rollouts.

    Optional: an environment whose episodes share a bounded resource in a process (e.g.
    web-crm-v1's browser contexts) is a `BoundedEnv` too; a run whose batch is larger is
    refused before it starts, since the rollout engine opens a whole batch at once. An
    environment whose calls bound their own time (`RemoteEnv`, in a worker process) sets
    `enforces_timeouts = True` (`rldojo.graders.base.SelfTimed`): the episode engine then
    adds no deadline of its own."""

    env_id: str

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        """The tasks of a split (`train`, `test`), deterministic for a seed."""
        ...

    async def reset(self, task: Task, *, seed: int) -> Observation:
        """Start an episode on `task`; the same task and seed give the same start."""
        ...

    async def step(self, action: str) -> StepResult:
        """Apply one policy turn; raises `EpisodeDone` after the episode ended."""
        ...

    async def close(self) -> None:
        """Release resources (subprocesses, connections)."""
        ...

    def default_grader(self) -> Grader:
        """The grader that scores this environment's rollouts."""
        ...


@runtime_checkable
class BoundedEnv(Protocol):
    """An environment whose episodes share a bounded resource in a process (`Env`'s
    optional members)."""

    @property
    def max_episodes_at_once(self) -> int:
        """How many of its episodes may be open at once in a process."""
        ...

    @property
    def max_episodes_at_once_key(self) -> str:
        """The kwarg that sets `max_episodes_at_once` (named in the error of a run over it)."""
        ...


EnvFactory: TypeAlias = Callable[[Task], Env] | Callable[[], Env]
"""Makes a fresh environment for each episode: from its task (a mixture routes by
`task.env`) or from nothing (one environment, e.g. `lambda: MathEnv()`). The rollout
engine, the held-out evaluation and `LocalGeneration` take one."""


class EpisodeDone(RuntimeError):
    """`step` was called after the episode finished."""


class EnvUnavailableError(RuntimeError):
    """This machine lacks something an environment needs (a browser, a package), so the
    environment cannot be made here; the config asking for it is fine. The message is one
    line that says how to get what is missing."""


class SingleTurnEnv:
    """Base for environments whose episode is one prompt and one answer.

    Subclasses provide `tasks` and `default_grader`; `system_prompt` is prepended when set.
    """

    env_id: str = ""
    system_prompt: str | None = None

    def __init__(self) -> None:
        self._done = True
        self._episode_task: Task | None = None

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        raise NotImplementedError

    def default_grader(self) -> Grader:
        raise NotImplementedError

    def prompt_messages(self, task: Task) -> list[dict[str, str]]:
        """The opening conversation for a task."""
        messages: list[dict[str, str]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        if isinstance(task.prompt, str):
            messages.append({"role": "user", "content": task.prompt})
        else:
            messages.extend(dict(m) for m in task.prompt)
        return messages

    async def reset(self, task: Task, *, seed: int) -> Observation:
        self._episode_task = task
        self._done = False
        return Observation(messages=self.prompt_messages(task), info={"seed": seed})

    async def step(self, action: str) -> StepResult:
        if self._done:
            raise EpisodeDone(f"{self.env_id}: step() after the episode ended")
        self._done = True
        return StepResult(messages=[], done=True)

    async def close(self) -> None:
        self._done = True


def turn_token_rewards(rollout: Rollout, per_turn: list[float]) -> tuple[float, ...] | None:
    """`per_turn[k]` on every token of the k-th policy turn (the k-th run of `policy_mask`
    in `completion_ids`), 0 elsewhere; None without token ids."""
    if not rollout.completion_ids:
        return None
    mask = rollout.policy_mask or (True,) * len(rollout.completion_ids)
    rewards, turn, previous = [0.0] * len(mask), -1, False
    for i, mine in enumerate(mask):
        turn += mine and not previous
        if mine and turn < len(per_turn):
            rewards[i] = per_turn[turn]
        previous = mine
    return tuple(rewards)
