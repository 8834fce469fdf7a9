"""rldojo.envs: the `Env` protocol, the registry of versioned environment ids, and built-ins.

    from rldojo.envs import make_env, list_envs
    env = make_env("arith-v1", levels=(1, 2))
    tasks = env.tasks("train", seed=0)

Built-in environments (`arith-v1`, `math-v1`, ...) are imported on first use of the
registry, so importing this package is cheap. `ArithEnv` and `MathEnv` are available as
attributes and imported when first accessed.
"""

from typing import TYPE_CHECKING, Any

from rldojo.envs.base import Env, EpisodeDone, SingleTurnEnv
from rldojo.envs.registry import UnknownEnvError, list_envs, make_env, register

if TYPE_CHECKING:
    from rldojo.envs.arith.env import ArithEnv
    from rldojo.envs.math.env import MathEnv

__all__ = [
    "ArithEnv",
    "Env",
    "EpisodeDone",
    "MathEnv",
    "SingleTurnEnv",
    "UnknownEnvError",
    "list_envs",
    "make_env",
    "register",
]

_LAZY = {"ArithEnv": "rldojo.envs.arith.env", "MathEnv": "rldojo.envs.math.env"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rldojo.envs' has no attribute {name!r}")
