"""One verifiers episode driven a policy turn at a time, and a finished one rebuilt.

verifiers runs a whole rollout itself (``MultiTurnEnv.rollout``, which calls the model
through its client). rldojo's rollout engine samples the policy instead, so `VfEpisode`
does what that loop does between model calls: ``init_state`` and ``setup_state`` at the
start; per policy turn, the turn appended to the trajectory (``add_trajectory_step``),
the stop conditions (``is_completed``), then ``get_prompt_messages`` (which calls the
environment's ``env_response``) for the next messages; ``cleanup`` (which renders the
completion) at the end. The client it hands verifiers refuses model calls: nothing in
verifiers samples the policy. Only append-only conversations are supported (an
environment that rewrites earlier messages would break token-in, token-out).

A grader sees the rollout, not this object, so `finished_state` rebuilds verifiers' state
from the rollout's messages and the task's dataset row; what the environment kept in
its state beyond verifiers' own keys travels in the rollout's info
(``verifiers/state``, the JSON-serialisable entries), as does a final environment
response (``verifiers/final_env_response``) that the policy never saw.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

from rldojo.envs.verifiers.loading import verifiers
from rldojo.envs.verifiers.messages import ENV_ID, assistant_message, to_rldojo, to_vf
from rldojo.types import Message, Rollout, Task, first_policy_turn

__all__ = ["VfEpisode", "finished_state", "rollout_input"]

_RENDERED = frozenset({
    "stop_condition", "is_completed", "is_truncated", "timed_out", "prompt_too_long",
    "completion", "reward", "metrics", "advantage", "final_env_response", "error",
})  # fmt: skip
"""State keys verifiers' own loop sets as a rollout ends (rebuilt, not carried)."""

MODEL = "rldojo-policy"
"""The model name verifiers' state records (rldojo's policy, sampled by rldojo)."""


@functools.cache
def _no_model_client_class() -> type:
    vf = verifiers()

    async def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{ENV_ID}: rldojo samples the policy; verifiers may not call it")

    methods = (
        "to_native_tool",
        "to_native_prompt",
        "get_native_response",
        "raise_from_native_response",
        "from_native_response",
    )
    body: dict[str, Any] = {name: refuse for name in methods}
    body["setup_client"] = lambda self, config: None
    body["close"] = lambda self: _done()
    return type("NoModelClient", (vf.Client,), body)


async def _done() -> None:
    return None


def no_model_client() -> Any:
    """A verifiers `Client` that refuses every model call."""
    return _no_model_client_class()(None)


def rollout_input(task: Task) -> dict[str, Any]:
    """verifiers' rollout input (the dataset row) of a verifiers-v1 task."""
    row = (task.info.get("verifiers") or {}).get("row")
    if not isinstance(row, Mapping):
        raise ValueError(f"{ENV_ID}: task {task.id} carries no verifiers dataset row")
    return copy.deepcopy(dict(row))


async def _init_state(vf_env: Any, task: Task) -> Any:
    return await vf_env.init_state(rollout_input(task), no_model_client(), MODEL)


def _json_entries(state: Mapping[str, Any], skip: set[str]) -> dict[str, Any]:
    out = {}
    for key, value in state.items():
        if key in skip:
            continue
        try:
            out[key] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue  # not JSON: stays in this process
    return out


class VfEpisode:
    """The state of one verifiers episode between policy turns (module docstring)."""

    def __init__(self, vf_env: Any, state: Any, own_keys: set[str]) -> None:
        self.vf_env, self.state, self.own_keys = vf_env, state, own_keys
        self.prompt: list[Any] = list(state["prompt"])
        self.protocol_errors = 0

    @classmethod
    async def start(cls, vf_env: Any, task: Task) -> VfEpisode:
        """``init_state`` from the task's row, then the environment's ``setup_state``."""
        state = await _init_state(vf_env, task)
        own_keys = set(state.keys()) | _RENDERED
        setup = await vf_env.setup_state(state)
        episode = cls(vf_env, state if setup is None else setup, own_keys)
        episode._raise_error()
        return episode

    @property
    def tools(self) -> bool:
        return bool(self.state.get("tool_defs"))

    async def turn(self, text: str) -> tuple[list[Message], bool]:
        """Apply one policy turn: `(the environment's new messages, done)`."""
        vf, state = verifiers(), self.state
        turn = len(state["trajectory"])
        assistant, errors = assistant_message(vf, text, turn, tools=self.tools)
        self.protocol_errors += errors
        step = vf.TrajectoryStep(
            prompt=self.prompt,
            completion=[assistant],
            response=None,
            tokens=None,
            reward=None,
            advantage=None,
            is_truncated=False,
            trajectory_id=state["trajectory_id"],
            extras={},
        )
        await self.vf_env.add_trajectory_step(state, step)
        if await self.vf_env.is_completed(state):
            return await self._finish()
        seen = len(self.prompt) + 1
        prompt = list(await self.vf_env.get_prompt_messages(state))
        if [_dump(m) for m in prompt[:seen]] != [_dump(m) for m in [*self.prompt, assistant]]:
            raise RuntimeError(
                f"{ENV_ID}: the environment rewrote earlier messages; only append-only "
                "conversations keep token-in, token-out"
            )
        self.prompt = prompt
        if await self.vf_env.is_completed(state):
            return await self._finish()
        return to_rldojo(prompt[seen:]), False

    async def _finish(self) -> tuple[list[Message], bool]:
        await self.vf_env.cleanup(self.state)
        self._raise_error()
        return [], True

    def _raise_error(self) -> None:
        """A verifiers error recorded in the state is the rollout's `env_error`."""
        error = self.state.get("error")
        if error is not None:
            raise RuntimeError(f"{ENV_ID}: the environment failed: {type(error).__name__}: {error}")

    def info(self) -> dict[str, Any]:
        """What the grader needs beyond the messages, and a few counters."""
        state = self.state
        final = state.get("final_env_response")
        return {
            "verifiers/state": _json_entries(state, self.own_keys),
            "verifiers/final_env_response": None if final is None else to_rldojo(final),
            "verifiers/stop_condition": state.get("stop_condition"),
            "episode/turns": len(state["trajectory"]),
            "format/protocol_errors": self.protocol_errors,
        }


def _dump(message: object) -> object:
    """A message as data: a pydantic message's fields, a dict as it is."""
    dump = getattr(message, "model_dump", None)
    return dump() if callable(dump) else message


async def finished_state(vf_env: Any, task: Task, rollout: Rollout) -> Any:
    """verifiers' state at the end of `rollout` (module docstring), ready for a rubric."""
    vf = verifiers()
    state = await _init_state(vf_env, task)
    tools = bool(state.get("tool_defs"))
    turns = rollout.messages[first_policy_turn(rollout.messages) :]
    final = rollout.info.get("verifiers/final_env_response") or []
    completion = to_vf(vf, [*turns, *final], tools=tools)
    for i, message in enumerate(completion):
        if message.role == "assistant":
            state["trajectory"].append(
                vf.TrajectoryStep(
                    prompt=[*state["prompt"], *completion[:i]],
                    completion=[message],
                    response=None,
                    tokens=None,
                    reward=None,
                    advantage=None,
                    is_truncated=False,
                    trajectory_id=state["trajectory_id"],
                    extras={},
                )
            )
    state["completion"] = completion
    state.update(rollout.info.get("verifiers/state") or {})
    state["is_completed"] = True
    state["stop_condition"] = rollout.info.get("verifiers/stop_condition")
    state["is_truncated"] = rollout.status == "truncated"
    return state
