"""The grader of verifiers-v1: the environment's own rubric, run with rldojo's statuses.

Every reward function of the rubric (of each rubric of a `RubricGroup`) is called the way
verifiers calls it: with the keyword arguments it names out of the rubric's score
objects (``prompt``, ``completion``, ``answer``, ``state``, ``info``, ``task``, the
``parser`` and the rubric's other class objects; all of them for ``**kwargs``), sync or
async, on the state `finished_state` rebuilds from the rollout. Each function's value is
a component under its name (summed where two share a name, as verifiers' metrics are);
the score is the weighted sum with the rubric's weights (weight-0 metrics are components
only).

Where verifiers logs a failing reward function and scores it 0, this grader fails the
whole score: a function that raises is `error`, one that runs past `timeout_s` is
`timeout` (sync functions run in a daemon thread, so one that never returns cannot hold
the process), a value that is not a finite number is `error`; the explanation names the
function. Group reward functions (``completions``, ``states``, ...) score a whole group
at once, which a per-rollout grader cannot; the environment refuses them when built.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Mapping
from typing import Any

from rldojo.envs.verifiers.episode import finished_state
from rldojo.envs.verifiers.loading import load_vf_env
from rldojo.envs.verifiers.messages import ENV_ID
from rldojo.types import Rollout, Score, Task

__all__ = ["VerifiersRubricGrader", "reward_functions"]

_GROUP_ARGS = frozenset({"states", "prompts", "completions", "answers", "tasks", "infos"})
"""The parameters by which verifiers tells a group reward function (`Rubric._is_group_func`)."""


def _name(func: object) -> str:
    return str(getattr(func, "__name__", repr(func)))


def reward_functions(rubric: Any) -> list[tuple[Any, Any, float]]:
    """`(rubric, function, weight)` for every function of `rubric` (groups flattened);
    a ValueError naming a group reward function."""
    if hasattr(rubric, "rubrics"):  # a RubricGroup
        return [entry for inner in rubric.rubrics for entry in reward_functions(inner)]
    out = []
    for func, weight in zip(rubric.funcs, rubric.weights, strict=True):
        if _GROUP_ARGS & set(inspect.signature(func).parameters):
            raise ValueError(
                f"{ENV_ID}: group reward function {_name(func)!r} is not supported "
                "(rldojo grades one rollout at a time)"
            )
        out.append((rubric, func, float(weight)))
    return out


async def _in_daemon_thread(func: Any, kwargs: Mapping[str, Any]) -> Any:
    """`func(**kwargs)` in a daemon thread, awaited without blocking the loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            result, error = func(**kwargs), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is gone: nobody waits any more
            pass

    threading.Thread(target=target, daemon=True, name=f"vf-reward-{_name(func)}").start()
    return await future


async def call_reward(rubric: Any, func: Any, state: Any) -> float:
    """One reward function's value, called as verifiers calls it (module docstring)."""
    objects = rubric.score_objects(state)
    params = inspect.signature(func).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        objects = {k: v for k, v in objects.items() if k in params}
    if inspect.iscoroutinefunction(func):
        value = await func(**objects)
    else:
        value = await _in_daemon_thread(func, objects)
        if inspect.isawaitable(value):
            value = await value
    return float(value)


class VerifiersRubricGrader:
    """Scores a verifiers-v1 rollout with its environment's rubric (module docstring)."""

    name = "verifiers_rubric"
    version = "1"

    def __init__(
        self, module: str, env_args: Mapping[str, Any] | None = None, *, timeout_s: float
    ) -> None:
        """`timeout_s`: verifiers-v1's `reward_timeout_s` (`VerifiersKwargs`)."""
        self.module, self.env_args, self.timeout_s = module, dict(env_args or {}), timeout_s

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov: dict[str, Any] = {"grader": self.name, "version": self.version, "module": self.module}
        vf_env = load_vf_env(self.module, self.env_args)
        state = await finished_state(vf_env, task, rollout)
        components: dict[str, float] = {}
        weights: dict[str, float] = {}
        total = 0.0
        for rubric, func, weight in reward_functions(vf_env.rubric):
            name = _name(func)
            try:
                value = await asyncio.wait_for(call_reward(rubric, func, state), self.timeout_s)
            except TimeoutError:
                why = f"reward function {name} took longer than {self.timeout_s:g}s"
                return Score.failed("timeout", why, provenance=prov)
            except Exception as exc:  # the function's failure is not the policy's 0
                why = f"reward function {name} raised {type(exc).__name__}: {exc}"
                return Score.failed("error", why, provenance=prov)
            if not math.isfinite(value):
                why = f"reward function {name} returned {value}"
                return Score.failed("error", why, provenance=prov)
            components[name] = components.get(name, 0.0) + value
            weights[name] = weight
            total += weight * value
        prov["weights"] = weights
        return Score(
            total,
            components=components,
            provenance=prov,
            explanation=f"weighted sum of {len(weights)} reward function(s)",
        )
