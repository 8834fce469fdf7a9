"""`rldojo.graders.load(spec)`: a grader from an OpenAI grader spec or rldojo's TOML.

    grader = load("grader.json")                       # a file: .json or .toml
    grader = load({"type": "string_check", ...})      # an inline table / dict
    grader = load('{"type": "multi", ...}')            # JSON text
    grader = load("my_pkg.graders:make_grader")        # a plugin: {"type": "my_pkg..."}

A spec is one grader table with a `type`:

    OpenAI (reinforcement fine-tuning grader JSON, unchanged): string_check,
    text_similarity, score_model, label_model, python, multi
    rldojo: rubric, group_judge, span_penalty, exact_match, math_verify
    plugins: a type from an installed package (entry-point group ``rldojo.graders``) or
             ``"package.module:factory"``, called with the table's other keys
             (`rldojo.graders.specs.context`); a spec that is only such a name is
             ``{"type": name}``

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
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rldojo.graders.base import Grader, judges_groups, pass_threshold_of
from rldojo.graders.judges.cache import JudgeCache
from rldojo.graders.judges.client import JudgeBackend, JudgeStats
from rldojo.graders.specs.common import GraderSpecError, check_keys
from rldojo.graders.specs.context import GRADERS, LoadContext, register_grader_type
from rldojo.types import Rollout, Score, Task

__all__ = [
    "GRADERS",
    "GraderSpecError",
    "LoadContext",
    "SpecGrader",
    "load",
    "read_spec",
    "register_grader_type",
]


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
        return judges_groups(self.grader)

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        return await self.grader.grade(rollout, task)

    async def grade_group(
        self, rollouts: Sequence[Rollout], task: Task, *, order: Sequence[int] | None = None
    ) -> list[Score]:
        if not judges_groups(self.grader):
            raise TypeError(f"{self.name} does not judge groups")
        return list(await self.grader.grade_group(rollouts, task, order=order))

    def stats(self) -> JudgeStats:
        return self.context.stats()

    async def close(self) -> None:
        await self.context.aclose()


_PLUGIN_NAME = re.compile(r"^[A-Za-z_][\w.-]*(:[A-Za-z_][\w.]*)?$")
"""A grader type's name or a ``package.module:factory`` path (never a file path)."""


def read_spec(spec: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A spec as a dict, from a dict, a .json/.toml file, JSON text, or the name of a
    grader type (``"package.module:factory"`` or an installed one)."""
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
        plugin = not isinstance(spec, Path) and _PLUGIN_NAME.match(text)
        if plugin and (":" in text or text in GRADERS):
            return {"type": text}
        raise GraderSpecError(
            f"{path}: grader spec file not found (nor a grader type; see `rldojo plugins`)"
        )
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
        threshold = pass_threshold_of(grader)
    return SpecGrader(grader, context, float(threshold), spec=inner)
