"""rldojo: reinforcement learning of language models on verifiable and agentic environments.

The public API is small: `train`, `sft`, `distill` and `evaluate` (`rldojo.api`; the
user's page is docs/api.md), the shared types, the environment registry, the `Env` and
`Grader` protocols and the run `Callback`. Everything else lives in its subpackage;
docs/architecture.md is the map. The API's names are imported on first use (PEP 562), so
`import rldojo` stays cheap: no torch until a run or an evaluation needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rldojo.envs.base import Env
from rldojo.envs.registry import list_envs, make_env, register
from rldojo.types import (
    Completion,
    Message,
    Observation,
    Rollout,
    SamplingParams,
    Score,
    StepResult,
    Task,
)

if TYPE_CHECKING:
    from rldojo.api import RunResult, distill, evaluate, sft, train
    from rldojo.config import load_config
    from rldojo.eval.harness import EvalResult
    from rldojo.graders.base import Grader
    from rldojo.training.callbacks import Callback

__version__ = "0.1.0"

_LAZY = {
    "train": "rldojo.api",
    "sft": "rldojo.api",
    "distill": "rldojo.api",
    "evaluate": "rldojo.api",
    "RunResult": "rldojo.api",
    "EvalResult": "rldojo.eval.harness",
    "load_config": "rldojo.config",
    "Grader": "rldojo.graders.base",
    "Callback": "rldojo.training.callbacks",
}
"""Names imported on first use: the module each comes from."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rldojo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Callback",
    "Completion",
    "Env",
    "EvalResult",
    "Grader",
    "Message",
    "Observation",
    "Rollout",
    "RunResult",
    "SamplingParams",
    "Score",
    "StepResult",
    "Task",
    "__version__",
    "distill",
    "evaluate",
    "list_envs",
    "load_config",
    "make_env",
    "register",
    "sft",
    "train",
]
