"""The plugin registry: named factories of one kind, built in, installed or named by path,
each remembering where it came from.

    ENVS = Registry("environment", "rldojo.envs", modules=("rldojo.envs.arith.env",))
    ENVS.register("my-env-v1", MyEnv)          # in-process
    ENVS.resolve("reverse-v1")                 # an installed package's (imported now)
    ENVS.resolve("my_pkg.envs:make_env")       # a path: imported, nothing registered
    ENVS.get("reverse-v1").origin              # entry point my_envs:Rev of my-envs 0.1

Three registries use it: environments (`rldojo.envs.registry`, entry-point group
``rldojo.envs``), graders (`rldojo.graders.specs.context`, ``rldojo.graders``) and experts
(`rldojo.envs.experts`, ``rldojo.experts``); `rldojo plugins` lists all three. Wherever
one of them takes a name it also takes ``"package.module:factory"``.

A registry fills itself on first use: its built-ins (`modules` imported, which register
themselves; `lazy` paths recorded; `setup` called), then the entry points of installed
packages. Nothing a plugin holds is imported before the plugin is resolved, so listing
stays cheap, and a built-in module or entry point that fails is kept in `errors` (and
named in "unknown ..." messages) instead of breaking the others.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Origin", "Plugin", "Registry", "import_path", "origin_of"]

OriginKind = Literal["builtin", "module", "entry point", "path"]


@dataclass(frozen=True)
class Origin:
    """Where a plugin came from: rldojo itself (``builtin``), code that called `register`
    (``module``), an installed distribution (``entry point``) or a ``path`` given by name."""

    kind: OriginKind
    target: str
    """What is imported: ``package.module:attribute``."""
    distribution: str | None = None
    """The installed distribution of an entry point (its project name)."""
    version: str | None = None
    """That distribution's version."""

    def __str__(self) -> str:
        if self.kind == "entry point":
            return f"entry point {self.target} of {self.distribution} {self.version}"
        return f"{self.kind} {self.target}"

    def as_dict(self) -> dict[str, str]:
        out = {"origin": self.kind, "target": self.target}
        if self.distribution is not None:
            out["distribution"] = self.distribution
        if self.version is not None:
            out["version"] = self.version
        return out


def origin_of(obj: Any) -> Origin:
    """The origin of an object registered in process: rldojo's own modules are built-ins."""
    module = str(getattr(obj, "__module__", None) or "?")
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    kind: OriginKind = "builtin" if module.split(".")[0] == "rldojo" else "module"
    return Origin(kind, f"{module}:{name}")


@dataclass
class Plugin:
    """One named plugin; `load` gives its object (importing it the first time)."""

    name: str
    origin: Origin
    obj: Any = None
    loader: Callable[[], Any] | None = field(default=None, repr=False)

    def load(self) -> Any:
        if self.loader is not None:
            self.obj, self.loader = self.loader(), None
        return self.obj


def import_path(path: str, kind: str, error: type[Exception]) -> Any:
    """``"pkg.module:attr"`` (attr may be dotted) -> the object, imported the way
    ``python -m`` would: from the installed packages, then the current directory. The
    object must be callable; failures are `error(one line)` naming `path`."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise error(f"{kind} {path!r}: expected 'package.module:factory'")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # as `python -m` would: ./my_env.py
        sys.path.append(cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise error(f"{kind} {path!r}: no module named {exc.name!r}") from None
        raise  # the module exists but one of its own imports is missing
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise error(
                f"{kind} {path!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(target):
        raise error(f"{kind} {path!r}: {attr!r} is not callable")
    return target


class Registry:
    """Plugins of one `kind` ("environment"), by name (see the module docstring).

    `modules`: built-in modules imported on first use (they call `register`); `lazy`:
    built-in names mapped to ``"module:attr"``, imported when resolved; `setup`: called
    once to register the rest; `name_pattern`: what an entry point's name must match;
    `error`: the exception (built from one line) raised for a name that cannot be resolved.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        *,
        modules: Sequence[str] = (),
        lazy: Mapping[str, str] | None = None,
        setup: Callable[[], None] | None = None,
        name_pattern: re.Pattern[str] | None = None,
        error: type[Exception] = LookupError,
    ) -> None:
        self.kind, self.group = kind, group
        self.modules, self.lazy, self.setup = tuple(modules), dict(lazy or {}), setup
        self.name_pattern, self.error = name_pattern, error
        self.plugins: dict[str, Plugin] = {}
        self.errors: dict[str, str] = {}
        """What failed to load (a built-in module, an entry point) and why."""
        self._state = "unloaded"  # -> "loading" -> "loaded"

    def load(self) -> None:
        """Register the built-ins and the installed packages' entry points, once."""
        if self._state != "unloaded":
            return
        self._state = "loading"
        try:
            for module in self.modules:
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    self.errors[module] = f"{type(exc).__name__}: {exc}"
                    warnings.warn(
                        f"rldojo: built-in {self.kind} module {module} failed to import: {exc}",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            for name, target in self.lazy.items():
                self.plugins.setdefault(
                    name, Plugin(name, Origin("builtin", target), loader=self._importer(target))
                )
            if self.setup is not None:
                self.setup()
            self.load_entry_points()
        finally:
            self._state = "loaded"

    def load_entry_points(self) -> None:
        """Add the entry points of group `group` (lazily: imported when resolved)."""
        for ep in importlib.metadata.entry_points(group=self.group):
            dist = ep.dist
            origin = Origin(
                "entry point",
                ep.value,
                dist.name if dist is not None else "?",
                dist.version if dist is not None else "?",
            )
            known = self.plugins.get(ep.name)
            if known is not None:
                if known.origin != origin:  # the same entry point seen again is no clash
                    self.errors[f"entry point {ep.name}"] = f"already registered ({known.origin})"
                continue
            if ":" in ep.name or (self.name_pattern and not self.name_pattern.match(ep.name)):
                pattern = self.name_pattern.pattern if self.name_pattern else "no ':'"
                self.errors[f"entry point {ep.name}"] = f"invalid name (expected {pattern})"
                continue
            self.plugins[ep.name] = Plugin(ep.name, origin, loader=ep.load)

    def register(
        self, name: str, obj: Any, *, overwrite: bool = False, origin: Origin | None = None
    ) -> None:
        """Add `obj` (callable) as `name`; ValueError when the name is taken (unless
        `overwrite`) or holds a ``:`` (that marks a path)."""
        if not callable(obj):
            raise ValueError(f"factory for {name!r} is not callable: {obj!r}")
        if ":" in name:
            raise ValueError(f"invalid {self.kind} name {name!r}: ':' marks 'module:factory'")
        self.load()  # so that a name clashing with a built-in is caught here
        if name in self.plugins and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered; pass overwrite=True")
        self.plugins[name] = Plugin(name, origin or origin_of(obj), obj)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self.load()
        return sorted(self.plugins)

    def entries(self) -> list[Plugin]:
        """Every registered plugin (unloaded ones stay unloaded), sorted by name."""
        return [self.plugins[name] for name in self.names()]

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self.plugins

    def get(self, name: str, *, paths: bool = True) -> Plugin:
        """The plugin registered as `name`, or (with `paths`) the one a
        ``"module:factory"`` path names, imported now; `error` otherwise."""
        if ":" in name and paths:
            return Plugin(name, Origin("path", name), import_path(name, self.kind, self.error))
        self.load()
        if name not in self.plugins:
            raise self.unknown(name)
        return self.plugins[name]

    def resolve(self, name: str, *, paths: bool = True) -> Any:
        """The object behind `name` (see `get`), imported if it was not yet."""
        return self.loaded(self.get(name, paths=paths))

    def loaded(self, plugin: Plugin) -> Any:
        """`plugin`'s object, imported if it was not yet; `error` if that fails."""
        name = plugin.name
        try:
            obj = plugin.load()
        except self.error:
            raise  # one line already (a built-in path that failed to import)
        except Exception as exc:
            raise self.error(
                f"{self.kind} {name!r} ({plugin.origin}): {type(exc).__name__}: {exc}"
            ) from None
        if not callable(obj):
            raise self.error(f"{self.kind} {name!r} ({plugin.origin}) is not callable")
        return obj

    def unknown(self, name: str) -> Exception:
        """`error` for an unknown name: the closest known one, all known ones, failures."""
        known = self.names()
        message = f"unknown {self.kind} {name!r}"
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
        message += f"; known: {', '.join(known) or '(none)'}; or pass 'package.module:factory'"
        if self.errors:
            failed = "; ".join(f"{m}: {e}" for m, e in self.errors.items())
            message += f"; {self.kind}s that failed to load: {failed}"
        return self.error(" ".join(message.split()))

    def _importer(self, target: str) -> Callable[[], Any]:
        return lambda: import_path(target, self.kind, self.error)
