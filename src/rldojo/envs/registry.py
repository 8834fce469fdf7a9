"""The environment registry: versioned ids ("arith-v1") mapped to factories.

    register("my-env-v1", MyEnv)            # a class or any callable returning an Env
    env = make_env("my-env-v1", level=2)    # kwargs go to the factory
    env = make_env("my_pkg.envs:make_env")  # no registration needed: import and call
    list_envs()                             # ["arith-v1", "math-v1", "my-env-v1"]

Built-in environments register themselves when their module is imported; the registry
imports the modules named in `BUILTIN_MODULES` on first use (`make_env`, `list_envs`,
`register`), so ``import rldojo.envs`` stays cheap. To add a built-in, write
``register("x-v1", XEnv)`` at the bottom of its module and add the module to the tuple.

Installed packages add environments through the entry-point group `rldojo.envs`: each
entry's name is an id and its value a factory, e.g. in the package's pyproject.toml

    [project.entry-points."rldojo.envs"]
    "reverse-v1" = "my_envs.reverse:ReverseEnv"

so after ``pip install my-envs`` the CLI knows ``reverse-v1`` (loaded on first use, like
the built-ins). A ``"module:factory"`` path is imported the way ``python -m`` does: from
the installed packages and then from the current directory. The registry is an
`rldojo.plugins.Registry` (`ENVS`), which also says where each environment came from.

Kwargs are checked before the factory runs: against its `Kwargs` model when it declares
one (`rldojo.envs.kwargs`), else against its signature. A factory built from its model (the
built-ins) receives the validated model; any other gets the keywords as written.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping

from pydantic import BaseModel

from rldojo.envs.base import Env
from rldojo.envs.kwargs import EnvKwargsError, kwargs_model, takes_model, validate_kwargs
from rldojo.plugins import Registry

__all__ = [
    "BUILTIN_MODULES",
    "ENVS",
    "EnvKwargsError",
    "UnknownEnvError",
    "build_env",
    "check_kwargs",
    "list_envs",
    "make_env",
    "register",
    "resolve_factory",
]

BUILTIN_MODULES: tuple[str, ...] = (
    "rldojo.envs.arith.env",
    "rldojo.envs.math.env",
    "rldojo.envs.mcq.env",
    "rldojo.envs.crm",
    "rldojo.envs.arith_tools",
    "rldojo.envs.games.env",
    "rldojo.envs.reasoning_gym.env",
    "rldojo.envs.code",
    "rldojo.envs.openenv.env",
    "rldojo.envs.verifiers.env",
    "rldojo.envs.web_crm.env",
)
"""Modules that register the built-in environments when imported."""

ENTRY_POINT_GROUP = "rldojo.envs"
"""Entry-point group through which installed packages register environments."""

ENV_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*-v\d+$")
"""Ids are lowercase names with a version suffix: ``arith-v1``, ``crm.sales-v2``."""


class UnknownEnvError(KeyError):
    """`make_env` was given an id that is not registered (or a factory path that fails)."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0]) if self.args else ""


ENVS = Registry(
    "environment",
    ENTRY_POINT_GROUP,
    modules=BUILTIN_MODULES,
    name_pattern=ENV_ID_PATTERN,
    error=UnknownEnvError,
)
"""Every environment: the built-ins, the installed packages' and those registered here."""


def register(env_id: str, factory: Callable[..., Env], *, overwrite: bool = False) -> None:
    """Register `factory` (called with `make_env`'s kwargs) under `env_id`.

    Raises ValueError when `env_id` does not look like ``name-v<N>`` (lowercase letters,
    digits, ``_.-``), when `factory` is not callable, or when the id is taken and
    `overwrite` is False.
    """
    if not isinstance(env_id, str) or not ENV_ID_PATTERN.match(env_id):
        raise ValueError(
            f"invalid environment id {env_id!r}: expected lowercase 'name-v<N>' "
            f"matching {ENV_ID_PATTERN.pattern}"
        )
    ENVS.register(env_id, factory, overwrite=overwrite)


def list_envs() -> list[str]:
    """All registered environment ids, sorted."""
    return ENVS.names()


def resolve_factory(env_id: str) -> Callable[..., Env]:
    """The factory behind `env_id` (registered, or ``"pkg.module:factory"``), uncalled.

    Env worker processes receive this (pickled) with the kwargs and build the env there.
    """
    factory: Callable[..., Env] = ENVS.resolve(env_id)
    return factory


def check_kwargs(
    env_id: str, factory: Callable[..., Env], kwargs: Mapping[str, object]
) -> BaseModel | None:
    """The factory's `Kwargs` model validated from `kwargs` (None for a factory without one,
    checked against its signature instead); `EnvKwargsError` (one line, naming the key)
    when they do not fit: an unknown name (with the closest accepted one), a wrong type, a
    missing argument."""
    model = kwargs_model(factory)
    if model is not None:
        return validate_kwargs(env_id, model, kwargs)
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return None
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None  # **kwargs: the factory takes anything
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in kwargs:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnvKwargsError(
                f"env.kwargs.{name}: {env_id} takes no argument {name!r}{hint}; "
                f"it takes: {', '.join(accepted) or '(none)'}"
            )
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        raise EnvKwargsError(f"env.kwargs: {env_id}: {exc}") from None
    return None


def build_env(env_id: str, factory: Callable[..., Env], kwargs: Mapping[str, object]) -> Env:
    """Build the environment: the factory's validated `Kwargs` model when it is built from
    one (`rldojo.envs.kwargs.takes_model`), else `factory(**kwargs)`; TypeError when the
    result is not an `Env`. Kwargs that do not fit, or that the factory rejects with a
    ValueError (a data file's `DataError` aside), are an `EnvKwargsError`."""
    validated = check_kwargs(env_id, factory, kwargs)
    env = _call_factory(env_id, factory, kwargs, validated)
    if not isinstance(env, Env):
        missing = [
            name
            for name in ("env_id", "tasks", "reset", "step", "close", "default_grader")
            if not hasattr(env, name)
        ]
        raise TypeError(
            f"factory for {env_id!r} returned {type(env).__name__}, which is not an Env "
            f"(missing: {', '.join(missing)})"
        )
    return env


def _call_factory(
    env_id: str,
    factory: Callable[..., Env],
    kwargs: Mapping[str, object],
    validated: BaseModel | None,
) -> Env:
    from rldojo.data.loading import DataError

    try:
        if validated is not None and takes_model(factory, type(validated)):
            return factory(validated)
        return factory(**kwargs)
    except (DataError, EnvKwargsError):
        raise  # one line already, naming the file or the key
    except ValueError as exc:
        # an environment's message names its id ("math-v1: test_fraction must be ..."):
        # named once here, after the key
        message = " ".join(str(exc).split()).removeprefix(f"{env_id}: ")
        raise EnvKwargsError(f"env.kwargs: {env_id}: {message}") from exc


def make_env(env_id: str, **kwargs: object) -> Env:
    """Build the environment registered as `env_id`, passing `kwargs` to its factory.

    `env_id` may also be ``"pkg.module:factory"``: the module is imported and the
    factory called with `kwargs`. Raises `UnknownEnvError` (a KeyError) for an unknown
    id, and TypeError when the factory returns something that is not an `Env`.
    """
    return build_env(env_id, resolve_factory(env_id), kwargs)
