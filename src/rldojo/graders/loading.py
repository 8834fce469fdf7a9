"""`rldojo.graders.load(spec)`: a grader from an OpenAI grader spec or rldojo's TOML.

    grader = load("grader.json")                       # a file: .json or .toml
    grader = load({"type": "string_check", ...})      # an inline table / dict
    grader = load('{"type": "multi", ...}')            # JSON text

A spec is one grader table with a `type`:

    OpenAI (reinforcement fine-tuning grader JSON, unchanged): string_check,
    text_similarity, score_model, label_model, python, multi
    rldojo: rubric, group_judge, span_penalty, exact_match, math_verify

or a wrapper ``{"grader": {...}, "judge": {...}, "embedding": {...}, "cache": ...}`` that
adds what an OpenAI spec cannot say: which endpoint answers for `model`, which embedding
model `cosine` uses, where the judge cache lives. Any grader table may also carry its
own `judge` table (it overrides the wrapper's). Judge tables:

    {base_url = "http://127.0.0.1:8000/v1", model = "...", api_key = "...",
     timeout_s = 60, max_retries = 3, backoff_s = 0.5, concurrency = 8}
    {backend = "transformers", model = "tiny-random", dtype = "auto"}

Without one, ``OPENAI_BASE_URL`` is used if set; otherwise a model grader is an error at
load time (rldojo never reaches for a hosted API by itself). The cache defaults to
``$RLDOJO_CACHE/judge.sqlite``; ``cache = false`` turns it off.

Every mistake is a `GraderSpecError` naming the field (``spec.graders.acc.operation:
expected one of eq, ne, like, ilike``). `load` returns a `SpecGrader`: the grader plus
the shared judges, cache and their counters, closed by ``await grader.close()``.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rldojo.config import ConfigError
from rldojo.graders.base import Grader
from rldojo.graders.judge import EngineJudge, JudgeBackend, JudgeClient, JudgeStats, OpenAIJudge
from rldojo.graders.judge_cache import JudgeCache, default_cache_path
from rldojo.types import Rollout, Score, Task

__all__ = [
    "GRADER_TYPES",
    "GraderSpecError",
    "LoadContext",
    "SpecGrader",
    "load",
    "read_spec",
    "register_grader_type",
]


class GraderSpecError(ConfigError):
    """A grader spec is malformed; the message names the field."""


Builder = Callable[[Mapping[str, Any], "LoadContext", str], Grader]
GRADER_TYPES: dict[str, Builder] = {}
"""Grader type name -> builder(spec, context, field path). See `register_grader_type`."""


def register_grader_type(name: str, builder: Builder) -> None:
    """Make `{"type": name, ...}` specs build with `builder(spec, context, path)`."""
    GRADER_TYPES[name] = builder


def check_keys(spec: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    """GraderSpecError for a key outside `allowed` (typos must not be ignored)."""
    for key in spec:
        if key not in allowed:
            raise GraderSpecError(f"{path}.{key}: unknown key (allowed: {', '.join(allowed)})")


def require(spec: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    """`spec[key]`, which must be present and of `kind`."""
    if key not in spec:
        raise GraderSpecError(f"{path}.{key}: missing")
    value = spec[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        names = "/".join(k.__name__ for k in _kinds(kind))
        raise GraderSpecError(f"{path}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


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
        from rldojo.graders.openai_spec import make_embedder

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
    """A judge backend from a judge table (see the module docstring)."""
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


class SpecGrader:
    """A grader loaded from a spec, with the judges and cache it shares (`context`)."""

    def __init__(
        self,
        grader: Grader,
        context: LoadContext,
        pass_threshold: float,
        spec: Mapping[str, Any] | None = None,
    ) -> None:
        self.grader = grader
        self.spec: Mapping[str, Any] = spec or {}
        """The grader's spec as loaded (its templates are checked against data up front)."""
        self.context = context
        self.name = grader.name
        self.pass_threshold = pass_threshold
        """Score value at or above which a sample counts as passing (summaries, eval-judge)."""

    @property
    def supports_groups(self) -> bool:
        return hasattr(self.grader, "grade_group")

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        return await self.grader.grade(rollout, task)

    async def grade_group(
        self, rollouts: Sequence[Rollout], task: Task, *, order: Sequence[int] | None = None
    ) -> list[Score]:
        grade_group = getattr(self.grader, "grade_group", None)
        if grade_group is None:
            raise TypeError(f"{self.name} does not judge groups")
        return list(await grade_group(rollouts, task, order=order))

    def stats(self) -> JudgeStats:
        return self.context.stats()

    async def close(self) -> None:
        await self.context.aclose()


def read_spec(spec: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A spec as a dict, from a dict, a .json/.toml file or JSON text."""
    if isinstance(spec, Mapping):
        return dict(spec)
    text = str(spec).strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GraderSpecError(f"spec: invalid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise GraderSpecError("spec: expected a JSON object")
        return value
    path = Path(text)
    if not path.is_file():
        raise GraderSpecError(f"{path}: grader spec file not found")
    try:
        data = (
            tomllib.loads(path.read_text())
            if path.suffix == ".toml"
            else json.loads(path.read_text())
        )
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise GraderSpecError(f"{path}: invalid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise GraderSpecError(f"{path}: expected a JSON object")
    return data


def load(
    spec: str | Path | Mapping[str, Any],
    *,
    judge: Mapping[str, Any] | JudgeBackend | None = None,
    cache: JudgeCache | str | Path | bool | None = None,
    embedding: Mapping[str, Any] | None = None,
) -> SpecGrader:
    """The grader described by `spec` (see the module docstring).

    Keyword arguments are defaults that the spec's wrapper keys override.
    """
    _register_builtin_types()
    data = read_spec(spec)
    if "type" not in data and "grader" in data:
        check_keys(data, ("grader", "judge", "embedding", "cache", "pass_threshold"), "spec")
        judge = data.get("judge", judge)
        embedding = data.get("embedding", embedding)
        cache = data.get("cache", cache)
        inner = data["grader"]
        threshold = data.get("pass_threshold")
    else:
        inner = data
        threshold = None
    if "type" in data and "cache" in data:  # rldojo extension key on a single grader
        cache = data["cache"]
        inner = {k: v for k, v in data.items() if k != "cache"}
    context = LoadContext(judge=judge, cache=cache, embedding=embedding)
    grader = context.build(inner, "spec")
    if threshold is None:
        threshold = getattr(grader, "pass_threshold", None)
    threshold = float(threshold) if threshold is not None else 1.0
    return SpecGrader(grader, context, threshold, spec=inner)


def _register_builtin_types() -> None:
    from rldojo.graders import openai_spec, rldojo_spec

    for name, builder in (*openai_spec.BUILDERS.items(), *rldojo_spec.BUILDERS.items()):
        GRADER_TYPES.setdefault(name, builder)
