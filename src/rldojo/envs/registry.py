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
the installed packages and then from the current directory.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

from rldojo.envs.base import Env

__all__ = [
    "BUILTIN_MODULES",
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
    "rldojo.envs.arith",
    "rldojo.envs.math",
    "rldojo.envs.mcq",
    "rldojo.envs.crm",
    "rldojo.envs.arith_tools",
    "rldojo.envs.games",
    "rldojo.envs.reasoning_gym",
    "rldojo.envs.code",
)
"""Modules that register the built-in environments when imported."""

ENTRY_POINT_GROUP = "rldojo.envs"
"""Entry-point group through which installed packages register environments."""

ENV_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]*-v\d+$")
"""Ids are lowercase names with a version suffix: ``arith-v1``, ``crm.sales-v2``."""

_factories: dict[str, Callable[..., Env]] = {}
_builtins_state = "unloaded"  # -> "loading" -> "loaded"
_builtin_errors: dict[str, str] = {}


class EnvKwargsError(ValueError):
    """`env.kwargs` do not match the environment factory's signature (message: one line)."""


class UnknownEnvError(KeyError):
    """`make_env` was given an id that is not registered (or a factory path that fails)."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0]) if self.args else ""


def _load_builtins() -> None:
    """Import the built-in environment modules once; they call `register` themselves.

    A built-in that fails to import is reported (warning, and in `UnknownEnvError`
    messages) instead of breaking every other environment.
    """
    global _builtins_state
    if _builtins_state != "unloaded":
        return
    _builtins_state = "loading"
    try:
        for module in BUILTIN_MODULES:
            try:
                importlib.import_module(module)
            except Exception as exc:
                _builtin_errors[module] = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"rldojo: built-in environment module {module} failed to import: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _load_entry_points()
    finally:
        _builtins_state = "loaded"


def _load_entry_points() -> None:
    """Register the environments of installed packages (`ENTRY_POINT_GROUP`), lazily:
    the factory's module is imported only when the id is used."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _factories:
            _builtin_errors[f"entry point {ep.name}"] = "id already registered"
            continue
        if not ENV_ID_PATTERN.match(ep.name):
            _builtin_errors[f"entry point {ep.name}"] = "invalid id (expected name-v<N>)"
            continue
        _factories[ep.name] = _LazyFactory(ep)


class _LazyFactory:
    """An entry point's factory, imported on first call (keeps `list_envs` cheap)."""

    def __init__(self, ep: importlib.metadata.EntryPoint) -> None:
        self.ep = ep
        self._target: Callable[..., Env] | None = None

    def load(self) -> Callable[..., Env]:
        if self._target is None:
            try:
                self._target = self.ep.load()
            except Exception as exc:
                raise UnknownEnvError(
                    f"environment {self.ep.name!r} (entry point {self.ep.value}): "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        return self._target

    def __call__(self, **kwargs: Any) -> Env:
        return self.load()(**kwargs)


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
    if not callable(factory):
        raise ValueError(f"factory for {env_id!r} is not callable: {factory!r}")
    _load_builtins()  # so that a user id clashing with a built-in is caught here
    if env_id in _factories and not overwrite:
        raise ValueError(f"environment {env_id!r} is already registered; pass overwrite=True")
    _factories[env_id] = factory


def list_envs() -> list[str]:
    """All registered environment ids, sorted."""
    _load_builtins()
    return sorted(_factories)


def _unknown(env_id: str) -> UnknownEnvError:
    known = list_envs()
    message = f"unknown environment {env_id!r}"
    close = difflib.get_close_matches(env_id, known, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    message += f"; known: {', '.join(known) or '(none)'}; or pass 'package.module:factory'"
    if _builtin_errors:
        failed = "; ".join(f"{m}: {e}" for m, e in _builtin_errors.items())
        message += f"; environments that failed to load: {failed}"
    return UnknownEnvError(" ".join(message.split()))


def _resolve_path(env_id: str) -> Callable[..., Env]:
    """``"pkg.module:factory"`` (attribute may be dotted) -> the factory."""
    module_name, _, attr = env_id.partition(":")
    if not module_name or not attr:
        raise _unknown(env_id)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # as `python -m` would: ./my_env.py
        sys.path.append(cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise UnknownEnvError(f"environment {env_id!r}: no module named {exc.name!r}") from None
        raise  # the module exists but one of its own imports is missing
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UnknownEnvError(
                f"environment {env_id!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(target):
        raise UnknownEnvError(f"environment {env_id!r}: {attr!r} is not callable")
    return target  # type: ignore[no-any-return]


def resolve_factory(env_id: str) -> Callable[..., Env]:
    """The factory behind `env_id` (registered, or ``"pkg.module:factory"``), uncalled.

    Env worker processes receive this (pickled) with the kwargs and build the env there.
    """
    if ":" in env_id:
        return _resolve_path(env_id)
    _load_builtins()
    if env_id not in _factories:
        raise _unknown(env_id)
    factory = _factories[env_id]
    return factory.load() if isinstance(factory, _LazyFactory) else factory


def check_kwargs(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> None:
    """Raise `EnvKwargsError` (one line) when `kwargs` do not fit the factory's signature:
    an unknown name (with the closest accepted one) or a missing required argument."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return  # **kwargs: the factory takes anything
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


def build_env(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> Env:
    """Call `factory(**kwargs)` and check that the result is an `Env` (TypeError if not);
    kwargs that do not fit the factory's signature, or that it rejects with a ValueError
    (a data file's `DataError` aside), are an `EnvKwargsError`."""
    check_kwargs(env_id, factory, kwargs)
    env = _call_factory(env_id, factory, kwargs)
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


def _call_factory(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> Env:
    from rldojo.data.loading import DataError

    try:
        return factory(**kwargs)
    except (DataError, EnvKwargsError):
        raise  # one line already, naming the file or the key
    except ValueError as exc:
        # an environment's message names its id ("math-v1: test_fraction must be ..."):
        # named once here, after the key
        message = " ".join(str(exc).split()).removeprefix(f"{env_id}: ")
        raise EnvKwargsError(f"env.kwargs: {env_id}: {message}") from exc


def make_env(env_id: str, **kwargs: Any) -> Env:
    """Build the environment registered as `env_id`, passing `kwargs` to its factory.

    `env_id` may also be ``"pkg.module:factory"``: the module is imported and the
    factory called with `kwargs`. Raises `UnknownEnvError` (a KeyError) for an unknown
    id, and TypeError when the factory returns something that is not an `Env`.
    """
    return build_env(env_id, resolve_factory(env_id), kwargs)
