"""Multi-turn environments: episode limits, counters, snapshot/fork, and the tool loop.

`MultiTurnEnv` owns what every multi-turn episode needs: the turn, token and wall-time
limits, a refusal (`EpisodeDone`) after the end, counters that reach the grader through
`StepResult.info`, and `snapshot()` / `restore()` / `fork()` of the whole episode.
Subclasses implement `turn(action)`; state they keep outside `self.episode` (a database,
a board) is saved by `save_state()` / `load_state()`. The environment is built from its
validated kwargs (`MultiTurnKwargs`, `ToolEnvKwargs`: `rldojo.envs.kwargs`); its own limits
are the default of the model's `limits` field, and a `limits` table is merged over them.

`ToolEnv` is the base of tool-using environments (crm-v1, arith-tools-v1): it shows the
tool schemas in the system prompt (and in `Observation.info["tools"]` for chat templates
with tool support), parses each turn with `rldojo.envs.tool_calls.parse_turn`, runs the calls
in order and returns one ``tool`` message per call. An ``<answer>`` ends the episode; a
turn with neither a call nor an answer gets a reminder (or ends it, `no_action="end"`).

Info keys (flat, JSON-serialisable; every step repeats the running totals, so the
engine's merge of step infos always holds the latest, even for a truncated episode):

    episode/turns, episode/tokens     turns taken, approximate tokens (policy + env text)
    episode/limit                     "turns" | "tokens" | "wall_time" when a limit ended it
    episode/done_reason               "answer" | "limit" | "no_action" | env-specific
    answer                            the final answer text (None until given)
    tool/calls, tool/by_name          valid calls executed, per tool name
    tool/errors                       calls that failed (all kinds below)
    tool/<kind>                       malformed, unknown_tool, bad_arguments,
                                      too_many_calls, tool_error, exception
    format/no_action                  turns with neither a tool call nor an answer
    format/protocol_errors            malformed + unknown_tool + bad_arguments + too_many_calls

`protocol_terms(info, ...)` turns these into the format components every tool grader adds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from rldojo.envs.base import EpisodeDone
from rldojo.envs.kwargs import (
    EpisodeLimits,
    MultiTurnKwargs,
    ToolEnvKwargs,
    given_kwargs,
    kwargs_model,
    validate_kwargs,
)
from rldojo.envs.tool_calls import ERROR_KINDS, PROTOCOL_ERRORS, parse_turn
from rldojo.envs.tools import Tool, ToolBox, tools_prompt
from rldojo.graders.base import Grader
from rldojo.types import Message, Observation, StepResult, Task

__all__ = [
    "EnvSnapshot",
    "EpisodeLimits",
    "EpisodeState",
    "MultiTurnEnv",
    "MultiTurnKwargs",
    "ToolEnv",
    "ToolEnvKwargs",
    "TurnOutcome",
    "approx_tokens",
    "protocol_terms",
]

_TOKEN = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate (words and punctuation marks), for episode budgets."""
    return len(_TOKEN.findall(text))


@dataclass
class EpisodeState:
    """Everything about the episode that is not the environment's own world state."""

    task: Task | None = None
    seed: int = 0
    turns: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    done: bool = True
    answer: str | None = None
    limit: str | None = None
    done_reason: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    by_name: dict[str, int] = field(default_factory=dict)

    def bump(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def copy(self) -> EpisodeState:
        """An independent copy (the task is immutable and shared)."""
        return dataclasses.replace(self, counts=dict(self.counts), by_name=dict(self.by_name))


@dataclass(frozen=True)
class EnvSnapshot:
    """The full state of an environment at one moment: episode plus world.

    Picklable (send it to another process, store it); equal snapshots mean equal states.
    """

    env_id: str
    episode: EpisodeState
    world: object = None


@dataclass
class TurnOutcome:
    """What one policy turn produced: messages to append and whether the episode ended."""

    messages: list[Message]
    done: bool = False
    done_reason: str | None = None


class MultiTurnEnv:
    """Base of multi-turn environments (see the module docstring).

    Subclasses set `env_id`, implement `tasks`, `default_grader`, `opening(task)` (the
    first messages), `turn(action)`, and optionally `setup(task, seed)`, `state_info()`,
    `save_state()` / `load_state()`. A family declares its kwargs as `Kwargs` (a
    `MultiTurnKwargs`) and is built from the validated model (`kwargs`), or from keywords
    validated against it; `fork()` builds a sibling from the same.

    A subclass may take plain keywords instead (``def __init__(self, items=2, *,
    limits=None, **kwargs)``, as `rldojo new-env` writes) and pass them all on
    (``super().__init__(limits=limits, items=items, **kwargs)``): the ones `Kwargs`
    declares are validated, all are kept (`init_kwargs`) for `fork()`, and its own limits
    are `default_limits`.
    """

    env_id: str = ""
    Kwargs: ClassVar[type[MultiTurnKwargs]] = MultiTurnKwargs
    """The model the environment is built from (each family declares its own)."""
    default_limits: ClassVar[EpisodeLimits | None] = None
    """The limits of a subclass built from plain keywords, under which a `limits` table is
    merged; None: those of `Kwargs` (a family declares its own as the default of its
    `limits` field)."""

    def __init__(self, kwargs: MultiTurnKwargs | None = None, /, **keywords: object) -> None:
        self.init_kwargs: dict[str, object] | None = None
        """The keywords the environment was built from, for `fork()` (None: a model)."""
        if kwargs is None:
            kwargs = self._from_keywords(keywords)
            self.init_kwargs, keywords = {**keywords, "limits": kwargs.limits}, {}
        self.kwargs = given_kwargs(self.env_id, self.Kwargs, kwargs, keywords)
        self.limits: EpisodeLimits = kwargs.limits
        self.episode = EpisodeState()

    def _from_keywords(self, keywords: Mapping[str, object]) -> MultiTurnKwargs:
        """`keywords` validated against `Kwargs`: all of them when the class declares its
        model, else only those the model has (the rest are the subclass's own)."""
        given = dict(keywords)
        limits = given.get("limits")
        if self.default_limits is not None and (limits is None or isinstance(limits, Mapping)):
            given["limits"] = {**self.default_limits.model_dump(), **dict(limits or {})}
        if kwargs_model(type(self)) is None:
            given = {k: v for k, v in given.items() if k in self.Kwargs.model_fields}
        return validate_kwargs(self.env_id, self.Kwargs, given)

    # ---------------------------------------------------------------- subclass hooks

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        raise NotImplementedError

    def default_grader(self) -> Grader:
        raise NotImplementedError

    async def setup(self, task: Task, seed: int) -> None:
        """Build the world state of a new episode (database, board...)."""

    def opening(self, task: Task) -> list[Message]:
        """The opening conversation of an episode."""
        if isinstance(task.prompt, str):
            return [{"role": "user", "content": task.prompt}]
        return [dict(m) for m in task.prompt]

    def opening_info(self) -> dict[str, Any]:
        return {}

    async def turn(self, action: str) -> TurnOutcome:
        raise NotImplementedError

    def state_info(self) -> dict[str, Any]:
        """Info about the world state, repeated on every step (for the grader)."""
        return {}

    def save_state(self) -> object:
        """The world state for a snapshot (must be picklable; copied, not shared)."""
        return None

    def load_state(self, state: object) -> None:
        """Restore the world state saved by `save_state`."""

    # ---------------------------------------------------------------- the Env protocol

    async def reset(self, task: Task, *, seed: int) -> Observation:
        self.episode = EpisodeState(task=task, seed=seed, done=False)
        await self.setup(task, seed)
        messages = self.opening(task)
        self.episode.tokens = sum(approx_tokens(m["content"]) for m in messages)
        return Observation(messages=messages, info={"seed": seed, **self.opening_info()})

    async def step(self, action: str) -> StepResult:
        ep = self.episode
        if ep.done:
            raise EpisodeDone(f"{self.env_id}: step() after the episode ended ({ep.done_reason})")
        if not isinstance(action, str):
            raise TypeError(f"{self.env_id}: action must be str, got {type(action).__name__}")
        started = time.perf_counter()
        ep.turns += 1
        ep.tokens += approx_tokens(action)
        outcome = await self.turn(action)
        ep.tokens += sum(approx_tokens(m["content"]) for m in outcome.messages)
        ep.wall_s += time.perf_counter() - started
        if outcome.done:
            ep.done, ep.done_reason = True, outcome.done_reason or "done"
        else:
            self._check_limits()
        messages = [] if ep.done else outcome.messages
        return StepResult(messages=messages, done=ep.done, info=self.info())

    def _check_limits(self) -> None:
        ep, lim = self.episode, self.limits
        for name, hit in (
            ("turns", ep.turns >= lim.max_turns),
            ("tokens", ep.tokens >= lim.max_tokens),
            ("wall_time", ep.wall_s >= lim.max_wall_s),
        ):
            if hit:
                ep.done, ep.limit, ep.done_reason = True, name, "limit"
                return

    def info(self) -> dict[str, Any]:
        """The running totals of the episode plus `state_info()` (fresh objects each call)."""
        ep = self.episode
        kinds = {f"tool/{kind}": ep.counts.get(kind, 0) for kind in ERROR_KINDS}
        return {
            "episode/turns": ep.turns,
            "episode/tokens": ep.tokens,
            "episode/limit": ep.limit,
            "episode/done_reason": ep.done_reason,
            "answer": ep.answer,
            "tool/calls": ep.counts.get("calls", 0),
            "tool/errors": ep.counts.get("errors", 0),
            "format/protocol_errors": sum(ep.counts.get(k, 0) for k in PROTOCOL_ERRORS),
            "format/no_action": ep.counts.get("format/no_action", 0),
            **kinds,
            "tool/by_name": dict(ep.by_name),
            **copy.deepcopy(self.state_info()),
        }

    async def close(self) -> None:
        self.episode.done = True

    # ---------------------------------------------------------------- snapshot and fork

    def snapshot(self) -> EnvSnapshot:
        """The full state now (episode and world); cheap, picklable, independent of `self`."""
        return EnvSnapshot(self.env_id, self.episode.copy(), self.save_state())

    def restore(self, snapshot: EnvSnapshot) -> None:
        """Return to `snapshot` exactly; later steps continue from there."""
        if snapshot.env_id != self.env_id:
            raise ValueError(f"snapshot of {snapshot.env_id!r} cannot restore {self.env_id!r}")
        self.episode = snapshot.episode.copy()
        self.load_state(snapshot.world)

    def fork(self) -> Self:
        """A new environment in exactly this state; the two then evolve independently."""
        if self.init_kwargs is None:
            child = type(self)(self.kwargs)
        else:
            child = type(self)(**self.init_kwargs)
        child.restore(self.snapshot())
        return child


class ToolEnv(MultiTurnEnv):
    """Base of tool-using environments (see the module docstring); its kwargs:
    `ToolEnvKwargs` (how tools are listed, calls per turn, the tool timeout, a turn
    without action, result length), which a family's model extends."""

    Kwargs: ClassVar[type[ToolEnvKwargs]] = ToolEnvKwargs
    kwargs: ToolEnvKwargs
    instructions: str = "You are a helpful assistant."

    def __init__(self, kwargs: ToolEnvKwargs | None = None, /, **keywords: object) -> None:
        super().__init__(kwargs, **keywords)
        self._toolbox: ToolBox | None = None

    def build_tools(self) -> list[Tool]:
        """The tools of this environment (called once, on first use)."""
        raise NotImplementedError

    @property
    def toolbox(self) -> ToolBox:
        if self._toolbox is None:
            self._toolbox = ToolBox(self.build_tools(), timeout_s=self.kwargs.tool_timeout_s)
        return self._toolbox

    def system_prompt(self, task: Task) -> str:
        tools = tools_prompt(self.toolbox.tools.values(), style=self.kwargs.schema_style)
        return f"{self.instructions}\n\n{tools}"

    def opening(self, task: Task) -> list[Message]:
        return [{"role": "system", "content": self.system_prompt(task)}, *super().opening(task)]

    def opening_info(self) -> dict[str, Any]:
        return {"tools": self.toolbox.schemas()}

    async def turn(self, action: str) -> TurnOutcome:
        ep = self.episode
        parsed = parse_turn(action, max_calls=self.kwargs.max_calls_per_turn)
        messages: list[Message] = []
        for error in parsed.errors:
            ep.bump(error.kind)
            ep.bump("errors")
            body = json.dumps({"error": error.kind, "message": error.message})
            messages.append({"role": "tool", "content": f"<tool_response>{body}</tool_response>"})
        for call in parsed.calls:
            result = await self.toolbox.call(call)
            if result.ok:
                ep.bump("calls")
                ep.by_name[call.name] = ep.by_name.get(call.name, 0) + 1
            else:
                ep.bump(result.error_kind or "exception")
                ep.bump("errors")
            messages.append(result.message(self.kwargs.max_result_chars))
        if parsed.answer is not None:
            ep.answer = parsed.answer
            return TurnOutcome(messages, done=True, done_reason="answer")
        if not parsed.calls and not parsed.errors:
            ep.bump("format/no_action")
            if self.kwargs.no_action == "end":
                return TurnOutcome(messages, done=True, done_reason="no_action")
            messages.append(
                {
                    "role": "user",
                    "content": "No tool call or final answer found. Call a tool with "
                    "<tool_call>...</tool_call> or reply with <answer>...</answer>.",
                }
            )
        return TurnOutcome(messages)


def protocol_terms(
    info: Mapping[str, Any],
    *,
    format_penalty: float,
    error_penalty: float,
    error_cap: int = 5,
) -> tuple[dict[str, float], float]:
    """Format components of a tool episode and the penalty they add up to.

    ``penalty = format_penalty * (no final answer)
              + error_penalty * min(protocol errors, error_cap)``

    Components: ``format`` (1.0 when a final answer was given), ``protocol_errors``,
    ``tool_calls``, ``tool_errors`` (counts, for metrics).
    """
    answered = info.get("answer") is not None
    errors = int(info.get("format/protocol_errors", 0) or 0)
    penalty = format_penalty * (0.0 if answered else 1.0) + error_penalty * min(errors, error_cap)
    components = {
        "format": 1.0 if answered else 0.0,
        "protocol_errors": float(errors),
        "tool_calls": float(info.get("tool/calls", 0) or 0),
        "tool_errors": float(info.get("tool/errors", 0) or 0),
    }
    return components, penalty
