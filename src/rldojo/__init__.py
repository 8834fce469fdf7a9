"""rldojo: reinforcement learning of language models on verifiable and agentic environments.

The public API is small: the shared types, the environment registry and the grader
protocol. Everything else lives in its subpackage; docs/architecture.md is the map.
"""

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

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "Message",
    "Observation",
    "Rollout",
    "SamplingParams",
    "Score",
    "StepResult",
    "Task",
    "__version__",
    "list_envs",
    "make_env",
    "register",
]
