"""What an environment worker process runs: the environment and grader calls.

Its trainer-side counterpart, and the failure semantics, are in `rldojo.rollout.env_pool`;
the process itself (its event loop, timeouts, whose call a crash is blamed on) is a
`rldojo.workers` worker. These functions are sent to it by reference (this module
imports by name there): `open_env` builds an environment from a pickled factory under
the episode's key, `reset_env`/`step_env`/`close_env` drive it, `grade` scores a rollout
with a grader built from a pickled recipe (once per worker). All but `open_env` are
coroutine functions, so async environments share a worker's event loop; `open_env` is one
too, so an environment's constructor sees that loop, as it would in the trainer.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rldojo.envs.base import Env
from rldojo.envs.registry import build_env
from rldojo.graders.base import Grader
from rldojo.types import Observation, Rollout, Score, StepResult, Task

_envs: dict[int, Env] = {}  # the environments open in this worker, by episode key
_graders: dict[bytes, Grader] = {}  # graders built in this worker, by their pickled recipe


async def open_env(key: int, env_id: str, factory: bytes, kwargs: dict[str, Any]) -> None:
    _envs[key] = build_env(env_id, _loads(factory), kwargs)


async def reset_env(key: int, task: Task, seed: int) -> Observation:
    return await _envs[key].reset(task, seed=seed)


async def step_env(key: int, action: str) -> StepResult:
    return await _envs[key].step(action)


async def close_env(key: int) -> None:
    env = _envs.pop(key, None)
    if env is not None:
        await env.close()


async def grade(recipe: bytes, rollout: Rollout, task: Task) -> Score:
    if recipe not in _graders:  # built once per worker, kept (graders keep pools warm)
        _graders[recipe] = _loads(recipe)()
    return await _graders[recipe].grade(rollout, task)


def env_default_grader(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> Grader:
    """A grader recipe: the default grader of an environment (built in the worker)."""
    return build_env(env_id, factory, kwargs).default_grader()


def spec_grader(spec: str | Path | Mapping[str, Any]) -> Grader:
    """A grader recipe: a grader spec (`rldojo.graders.load`), built in the worker."""
    from rldojo.graders import load

    return load(spec)


def _loads(blob: bytes) -> Callable[..., Any]:
    recipe: Callable[..., Any] = pickle.loads(blob)
    return recipe
