"""verifiers-v1: an environment written for the `verifiers` library, as an rldojo `Env`.

    [env]
    id = "verifiers-v1"
    kwargs = { module = "vf_math", env_args = { difficulty = "easy" } }

`module` is found and loaded as verifiers' ``load_environment`` finds it, or from a path
(`rldojo.envs.verifiers.loading`); `env_args` go to the module's ``load_environment``.
Its ``dataset`` and ``eval_dataset`` are the train and test tasks. A single-turn
environment ends after one policy turn; a multi-turn or tool environment answers each
turn with its ``env_response`` until one of its stop conditions holds
(`rldojo.envs.verifiers.episode`): the policy's text goes in unchanged and the
environment's messages are appended, so the rollout engine's token ids stay exact. Tool
environments list their tools in the system prompt (``tool_prompt = "system"``) with
rldojo's ``<tool_call>`` syntax, and always in `Observation.info["tools"]` for chat
templates that render tools.

The grader is the environment's rubric (`rldojo.envs.verifiers.grader`): each reward
function a component, the weighted sum the score, a failing function a status. A module
that cannot be found, imported or built, or whose rubric scores groups, is a one-line
config error naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from rldojo.envs.base import EpisodeDone
from rldojo.envs.kwargs import EnvKwargs, given_kwargs
from rldojo.envs.registry import register
from rldojo.envs.verifiers.episode import VfEpisode
from rldojo.envs.verifiers.grader import VerifiersRubricGrader, reward_functions
from rldojo.envs.verifiers.loading import dataset_tasks, load_vf_env, module_problem
from rldojo.envs.verifiers.messages import ENV_ID, to_rldojo, tool_schemas, tools_section
from rldojo.types import Message, Observation, StepResult, Task

__all__ = ["ENV_ID", "VerifiersEnv", "VerifiersKwargs"]


class VerifiersKwargs(EnvKwargs):
    """The kwargs of verifiers-v1 (`[env] kwargs`)."""

    module: str
    """The verifiers environment: a module name as verifiers' ``load_environment`` takes
    it (``vf_math``, ``my-env``, ``pkg.envs.math``), or a path to a ``.py`` file or an
    environment directory."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the module's ``load_environment``."""
    tool_prompt: Literal["system", "template"] = "system"
    """Where a tool environment's tools are listed: in the system prompt with the
    ``<tool_call>`` syntax, or only in `Observation.info["tools"]` (the chat template
    renders them)."""
    reward_timeout_s: float = Field(30.0, gt=0)
    """Time limit of one reward function, in seconds (status `timeout` past it)."""

    @field_validator("module")
    @classmethod
    def _module_exists(cls, module: str) -> str:
        problem = module_problem(module)
        if problem is not None:
            raise ValueError(problem)
        return module


class VerifiersEnv:
    """A verifiers environment module's episodes as an rldojo `Env` (module docstring);
    built from `VerifiersKwargs` (or keywords validated against it)."""

    Kwargs = VerifiersKwargs
    env_id = ENV_ID

    def __init__(self, kwargs: VerifiersKwargs | None = None, /, **keywords: object) -> None:
        self.kwargs = given_kwargs(ENV_ID, VerifiersKwargs, kwargs, keywords)
        self.vf_env = load_vf_env(self.kwargs.module, self.kwargs.env_args)
        reward_functions(self.vf_env.rubric)  # a group reward function: refused now
        self._episode: VfEpisode | None = None

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        """The dataset's rows (`train`) or the eval dataset's (`test`), shuffled by `seed`."""
        return dataset_tasks(self.vf_env, self.kwargs.module, split, seed=seed, n=n)

    def default_grader(self) -> VerifiersRubricGrader:
        c = self.kwargs
        return VerifiersRubricGrader(c.module, c.env_args, timeout_s=c.reward_timeout_s)

    async def reset(self, task: Task, *, seed: int) -> Observation:
        """verifiers' ``init_state`` and ``setup_state`` on the task's dataset row."""
        self._episode = await VfEpisode.start(self.vf_env, task)
        state = self._episode.state
        messages = to_rldojo(state["prompt"])
        info: dict[str, Any] = {"seed": seed}
        if state.get("tool_defs"):
            info["tools"] = tool_schemas(state["tool_defs"])
            if self.kwargs.tool_prompt == "system":
                messages = _with_tools(messages, tools_section(state["tool_defs"]))
        return Observation(messages=messages, info=info)

    async def step(self, action: str) -> StepResult:
        """One policy turn through the verifiers environment (`VfEpisode.turn`)."""
        episode = self._episode
        if episode is None:
            raise EpisodeDone(f"{ENV_ID}: step() after the episode ended (or before reset)")
        messages, done = await episode.turn(action)
        info = episode.info()
        if done:
            self._episode = None
        return StepResult(messages=messages, done=done, info=info)

    async def close(self) -> None:
        """End the episode (verifiers' cleanup handlers run if it was cut short); the
        loaded environment stays for the next one."""
        episode, self._episode = self._episode, None
        if episode is not None:
            await episode.vf_env.cleanup(episode.state)


def _with_tools(messages: list[Message], section: str) -> list[Message]:
    """The opening with the tools section appended to its system message (or one added)."""
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{section}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


register(ENV_ID, VerifiersEnv)
