"""What graders built from one spec share (`LoadContext`), and the grader-type registry.

`GRADERS` (an `rldojo.plugins.Registry`) maps a spec's ``type`` to what builds it;
`LoadContext.build` dispatches on it. Built-in types and those added in process with
`register_grader_type` are builders, ``builder(spec, context, path) -> Grader``. A type
from an installed package (entry-point group ``rldojo.graders``) or named by path
(``type = "pkg.mod:make_grader"``) is a factory: it is called with the table's other
keys as keyword arguments and returns an object with ``async grade(rollout, task) ->
Score``. `make_backend` turns a judge table into a judge backend (tables: see `loading`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rldojo.graders.base import Grader
from rldojo.graders.judges.cache import JudgeCache, default_cache_path
from rldojo.graders.judges.client import (
    EngineJudge,
    JudgeBackend,
    JudgeClient,
    JudgeStats,
    OpenAIJudge,
)
from rldojo.graders.specs.common import GraderSpecError, check_keys, require
from rldojo.graders.specs.embedding import Embedder, make_embedder
from rldojo.plugins import Registry
from rldojo.types import Rollout, Score, Task

__all__ = ["GRADERS", "Builder", "LoadContext", "make_backend", "register_grader_type"]


Builder = Callable[[Mapping[str, Any], "LoadContext", str], Grader]


def _builtin_types() -> None:
    from rldojo.graders.specs import openai_text, rldojo_types

    for name, builder in (*openai_text.BUILDERS.items(), *rldojo_types.BUILDERS.items()):
        if name not in GRADERS.plugins:  # one registered in process first stays
            GRADERS.register(name, builder)


GRADERS = Registry("grader type", "rldojo.graders", setup=_builtin_types, error=GraderSpecError)
"""Grader types: the built-in builders, those registered here, installed factories."""


def register_grader_type(name: str, builder: Builder) -> None:
    """Make `{"type": name, ...}` specs build with `builder(spec, context, path)`."""
    GRADERS.register(name, builder, overwrite=True)


@runtime_checkable
class _Grades(Protocol):
    """What a plugin's factory must return: a `Grader`, its `name` optional."""

    async def grade(self, rollout: Rollout, task: Task) -> Score: ...


class _NamedGrader:
    """A plugin's grader without a `name`: named after its type."""

    def __init__(self, inner: _Grades, name: str) -> None:
        self.inner, self.name = inner, name

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        return await self.inner.grade(rollout, task)


def _from_factory(
    kind: str, factory: Callable[..., object], spec: Mapping[str, Any], path: str
) -> Grader:
    """The grader an installed or path factory returns for the table's other keys."""
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    try:
        grader = factory(**kwargs)
    except (TypeError, ValueError) as exc:
        raise GraderSpecError(f"{path}: {kind}: {' '.join(str(exc).split())}") from None
    if not isinstance(grader, _Grades):
        raise GraderSpecError(
            f"{path}.type: {kind} returned {type(grader).__name__}, which has no grade()"
        )
    if isinstance(grader, Grader) and isinstance(grader.name, str):
        return grader
    return _NamedGrader(grader, kind)


_JUDGE_KEYS = (
    "backend",
    "base_url",
    "model",
    "api_key",
    "api_key_env",
    "timeout_s",
    "max_retries",
    "backoff_s",
    "concurrency",
    "dtype",
    "max_batch",
)


class LoadContext:
    """What graders built from one spec share: judge backends, the cache, embedders."""

    def __init__(
        self,
        *,
        judge: Mapping[str, Any] | JudgeBackend | None = None,
        cache: JudgeCache | str | Path | bool | None = None,
        embedding: Mapping[str, Any] | None = None,
    ) -> None:
        self.judge = judge
        self.embedding = embedding
        self._cache_setting = cache
        self._cache: JudgeCache | None = cache if isinstance(cache, JudgeCache) else None
        self._clients: dict[str, JudgeClient] = {}
        self._embedders: dict[str, Embedder] = {}

    @property
    def cache(self) -> JudgeCache | None:
        if self._cache is None and self._cache_setting is not False:
            setting = self._cache_setting
            path = default_cache_path() if setting in (None, True) else Path(str(setting))
            self._cache = JudgeCache(path)
        return self._cache

    def build(self, spec: object, path: str) -> Grader:
        """The grader for one spec table (dispatch on its `type`)."""
        if not isinstance(spec, Mapping):
            raise GraderSpecError(f"{path}: expected a grader table, got {type(spec).__name__}")
        kind = require(spec, "type", str, path)
        try:
            plugin = GRADERS.get(kind)
            target = GRADERS.loaded(plugin)
        except GraderSpecError as exc:
            raise GraderSpecError(f"{path}.type: {exc}") from None
        if plugin.origin.kind in ("entry point", "path"):
            return _from_factory(kind, target, spec, path)
        built: Grader = target(spec, self, path)
        return built

    def judge_client(self, own: object, default_model: str | None, path: str) -> JudgeClient:
        """The shared client for a grader's judge (its own `judge` table, else the wrapper's)."""
        if isinstance(self.judge, Mapping) or self.judge is None:
            config = dict(self.judge or {})
        else:  # a ready backend object
            backend = self.judge
            if own is None:
                return self._client("backend-object", lambda: backend)
            config = {}
        if own is not None:
            if not isinstance(own, Mapping):
                raise GraderSpecError(f"{path}.judge: expected a table")
            config |= dict(own)
        check_keys(config, _JUDGE_KEYS, f"{path}.judge")
        if "model" not in config and default_model:
            config["model"] = default_model
        key = json.dumps(config, sort_keys=True, default=str)
        return self._client(key, lambda: make_backend(config, f"{path}.judge"))

    def _client(self, key: str, factory: Callable[[], JudgeBackend]) -> JudgeClient:
        if key not in self._clients:
            self._clients[key] = JudgeClient(factory(), self.cache)
        return self._clients[key]

    def embedder(self, own: object, path: str) -> Embedder:
        config = own if own is not None else self.embedding
        if not isinstance(config, Mapping):
            raise GraderSpecError(
                f"{path}: cosine needs an embedding model: add embedding = {{base_url = ..., "
                f'model = ...}} or {{backend = "transformers", model = ...}}'
            )
        key = json.dumps(dict(config), sort_keys=True, default=str)
        if key not in self._embedders:
            self._embedders[key] = make_embedder(config, f"{path}.embedding")
        return self._embedders[key]

    def stats(self) -> JudgeStats:
        """Judge calls and cache hits of every judge built from this spec, summed."""
        total = JudgeStats()
        for client in self._clients.values():
            total.calls += client.stats.calls
            total.cache_hits += client.stats.cache_hits
            total.failures += client.stats.failures
        return total

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        for embedder in self._embedders.values():
            await embedder.aclose()
        if self._cache is not None:
            self._cache.close()
            self._cache = None
            self._cache_setting = False


def make_backend(config: Mapping[str, Any], path: str) -> JudgeBackend:
    """A judge backend from a judge table (see `rldojo.graders.specs.loading`)."""
    backend = config.get("backend")
    base_url = config.get("base_url") or os.environ.get("OPENAI_BASE_URL")
    if backend is None:
        backend = "openai" if base_url else None
    model = config.get("model")
    if backend is None:
        raise GraderSpecError(
            f"{path}: no judge backend configured: set judge.base_url (an OpenAI-compatible "
            f'endpoint, e.g. `rldojo serve`) or judge.backend = "transformers"'
        )
    if not isinstance(model, str) or not model:
        raise GraderSpecError(f"{path}.model: missing (the judge model's name)")
    if backend == "transformers":
        from rldojo.inference.engine import TransformersEngine

        engine = TransformersEngine(
            model,
            dtype=str(config.get("dtype", "auto")),
            max_batch=int(config.get("max_batch", 16)),
        )
        return EngineJudge(engine)
    if backend != "openai":
        raise GraderSpecError(f"{path}.backend: expected openai or transformers, got {backend!r}")
    if not base_url:
        raise GraderSpecError(f"{path}.base_url: missing (or set OPENAI_BASE_URL)")
    key_env = str(config.get("api_key_env", "OPENAI_API_KEY"))
    return OpenAIJudge(
        str(base_url),
        model,
        api_key=str(config.get("api_key") or os.environ.get(key_env) or "EMPTY"),
        timeout_s=float(config.get("timeout_s", 60.0)),
        max_retries=int(config.get("max_retries", 3)),
        backoff_s=float(config.get("backoff_s", 0.5)),
        concurrency=int(config.get("concurrency", 8)),
    )
