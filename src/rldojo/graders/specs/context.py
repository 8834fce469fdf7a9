"""What graders built from one spec share (`LoadContext`), and the grader-type registry.

`GRADER_TYPES` maps a spec's ``type`` to its builder; `LoadContext.build` dispatches on it,
`register_grader_type` adds to it and `rldojo.graders.specs.loading` fills in the built-in
types. `make_backend` turns a judge table into a judge backend (tables: see `loading`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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
from rldojo.graders.specs.embedding import make_embedder

__all__ = ["GRADER_TYPES", "Builder", "LoadContext", "make_backend", "register_grader_type"]


Builder = Callable[[Mapping[str, Any], "LoadContext", str], Grader]
GRADER_TYPES: dict[str, Builder] = {}
"""Grader type name -> builder(spec, context, field path). See `register_grader_type`."""


def register_grader_type(name: str, builder: Builder) -> None:
    """Make `{"type": name, ...}` specs build with `builder(spec, context, path)`."""
    GRADER_TYPES[name] = builder


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
        self._embedders: dict[str, Any] = {}

    @property
    def cache(self) -> JudgeCache | None:
        if self._cache is None and self._cache_setting is not False:
            setting = self._cache_setting
            path = default_cache_path() if setting in (None, True) else Path(str(setting))
            self._cache = JudgeCache(path)
        return self._cache

    def build(self, spec: Any, path: str) -> Grader:
        """The grader for one spec table (dispatch on its `type`)."""
        if not isinstance(spec, Mapping):
            raise GraderSpecError(f"{path}: expected a grader table, got {type(spec).__name__}")
        kind = require(spec, "type", str, path)
        if kind not in GRADER_TYPES:
            raise GraderSpecError(
                f"{path}.type: unknown grader type {kind!r} (known: {', '.join(GRADER_TYPES)})"
            )
        return GRADER_TYPES[kind](spec, self, path)

    def judge_client(self, own: Any, default_model: str | None, path: str) -> JudgeClient:
        """The shared client for a grader's judge (its own `judge` table, else the wrapper's)."""
        if isinstance(self.judge, Mapping) or self.judge is None:
            config = dict(self.judge or {})
        else:  # a ready backend object
            if own is None:
                return self._client("backend-object", lambda: self.judge)  # type: ignore[arg-type,return-value]
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

    def embedder(self, own: Any, path: str) -> Any:
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
        from rldojo.serve.engine import TransformersEngine

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
