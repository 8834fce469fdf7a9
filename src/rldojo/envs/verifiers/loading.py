"""Finding and loading a verifiers environment module, and its datasets as rldojo tasks.

`module` names the environment the way verifiers' own ``load_environment(env_id)`` finds
it: an importable module (``vf_math``, ``my_pkg.envs.math``; ``-`` read as ``_`` and a hub
prefix ``owner/`` dropped, as verifiers does), or, rldojo's addition, a path to a ``.py``
file or to a directory holding ``__init__.py`` or ``<name>.py`` (the layout of verifiers'
``environments/<name>/`` projects). The module's ``load_environment(**env_args)`` builds
the environment.

A loaded environment is kept per ``(module, env_args)`` in this process: loading builds
its datasets, and a verifiers environment keeps each rollout's state in that rollout's
own `State`, so one instance serves every episode (and the grader). Loading runs
verifiers' constructor, which installs SIGINT/SIGTERM handlers of its own; rldojo's are
put back afterwards.

Tasks: split ``train`` is the environment's ``dataset``, ``test`` its ``eval_dataset``
(empty when it has none: verifiers' fallback to the training set would make a held-out
score out of training tasks), shuffled by verifiers' ``get_dataset(n, seed)``, so the
same seed gives the same tasks. Each task keeps its dataset row (`Task.info`), from which
the episode and the grader rebuild verifiers' rollout input.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import json
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from rldojo.envs.verifiers.messages import ENV_ID, prompt_messages
from rldojo.types import Task

__all__ = [
    "OptionalDependencyError",
    "dataset_tasks",
    "load_vf_env",
    "module_problem",
    "verifiers",
]


class OptionalDependencyError(ImportError):
    """The optional `verifiers` package (with its classic API) is not installed."""


def verifiers() -> Any:
    """The `verifiers` module with its classic API, or `OptionalDependencyError`."""
    try:
        vf = importlib.import_module("verifiers")
        vf.SingleTurnEnv  # noqa: B018 - verifiers >= 0.4 has only `verifiers.v1`
    except ImportError as exc:
        raise OptionalDependencyError(
            f"{ENV_ID} needs the optional package verifiers: pip install 'rldojo[verifiers]' "
            f"({exc})"
        ) from None
    except AttributeError:
        raise OptionalDependencyError(
            f"{ENV_ID} needs verifiers' classic API (SingleTurnEnv, ToolEnv, Rubric), "
            f"which verifiers {getattr(vf, '__version__', '?')} no longer has: "
            "pip install 'verifiers>=0.3,<0.4'"
        ) from None
    return vf


def _module_name(module: str) -> str:
    """verifiers' rule (``env_module_name``): ``owner/my-env`` -> ``my_env``."""
    return module.replace("-", "_").split("/")[-1]


def _module_file(module: str) -> Path | None:
    """The file to load when `module` is a path (None: it is a module name)."""
    path = Path(module)
    if path.is_file():
        return path
    if path.is_dir():
        for candidate in (path / "__init__.py", path / f"{_module_name(path.name)}.py"):
            if candidate.is_file():
                return candidate
    return None


def module_problem(module: str) -> str | None:
    """Why `module` names no verifiers environment (one line), or None when it does."""
    path = Path(module)
    if path.is_dir() and _module_file(module) is None:
        return f"{module!r} is a directory without __init__.py or {_module_name(path.name)}.py"
    if _module_file(module) is not None:
        return None
    if module.endswith(".py"):
        return f"no verifiers environment file {module!r} (no such file)"
    name = _module_name(module)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return f"cannot import verifiers environment module {name!r}: {exc}"
    if spec is None:
        return f"no verifiers environment module {module!r} (not importable, not a path)"
    return None


def _import_file(file: Path) -> ModuleType:
    """Import a module from its file, registered in `sys.modules` under its stem."""
    package = file.name == "__init__.py"
    name = _module_name(file.parent.name if package else file.stem)
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(file):
        return sys.modules[name]
    locations = [str(file.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[name]
        raise
    return loaded


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Put back the SIGINT/SIGTERM handlers a verifiers constructor replaces."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


_LOADED: dict[str, Any] = {}
"""Loaded environments by ``(module, env_args)`` (module docstring: why one per process)."""


def load_vf_env(module: str, env_args: Mapping[str, Any] | None = None) -> Any:
    """The verifiers environment `module` builds with `env_args` (cached); a ValueError
    naming the module when it cannot be found, imported or built."""
    args = dict(env_args or {})
    key = json.dumps([module, args], sort_keys=True, default=repr)
    if key in _LOADED:
        return _LOADED[key]
    vf = verifiers()
    problem = module_problem(module)
    if problem is not None:
        raise ValueError(f"{ENV_ID}: {problem}")
    try:
        with _signal_handlers_kept():
            file = _module_file(module)
            if file is None:
                env = vf.load_environment(module, **args)
            else:
                env = _import_file(file).load_environment(**args)
                env.env_id, env.env_args = env.env_id or file.stem, env.env_args or args
    except Exception as exc:  # the module's own failure, told in one line
        cause = exc.__cause__ if isinstance(exc, RuntimeError | ValueError) else None
        why = f"{type(exc).__name__}: {exc}" + (f" ({cause})" if cause else "")
        raise ValueError(f"{ENV_ID}: cannot load verifiers environment {module!r}: {why}") from exc
    if not isinstance(env, vf.Environment):
        raise ValueError(
            f"{ENV_ID}: load_environment of {module!r} returned {type(env).__name__}, "
            "not a verifiers Environment"
        )
    _LOADED[key] = env
    return env


def _json_safe(row: Mapping[str, object]) -> dict[str, Any]:
    """A dataset row as plain JSON data (tasks go to the ledger and to workers)."""
    return dict(json.loads(json.dumps(dict(row), default=str)))


def dataset_tasks(vf_env: Any, module: str, split: str, *, seed: int, n: int | None) -> list[Task]:
    """The tasks of `split` (module docstring), at most `n`."""
    if split not in ("train", "test"):
        raise ValueError(f"{ENV_ID}: unknown split {split!r} (train or test)")
    if n == 0:
        return []
    if split == "train":
        dataset = vf_env.get_dataset(n=n or -1, seed=seed)
    elif vf_env.build_eval_dataset() is None:
        return []
    else:
        dataset = vf_env.get_eval_dataset(n=n or -1, seed=seed)
    name = _module_name(Path(module).stem if module.endswith(".py") else module)
    return [_task(name, module, split, _json_safe(row)) for row in dataset]


def _task(name: str, module: str, split: str, row: dict[str, Any]) -> Task:
    answer = row.get("answer")
    return Task(
        id=f"{ENV_ID}/{name}/{split}/{row.get('example_id')}",
        prompt=prompt_messages(row.get("prompt") or []),
        answer=None if answer is None else str(answer),
        info={"verifiers": {"module": module, "split": split, "row": copy.deepcopy(row)}},
        env=ENV_ID,
    )
