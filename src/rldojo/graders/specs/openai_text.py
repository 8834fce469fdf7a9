"""OpenAI reinforcement fine-tuning grader specs: string_check, text_similarity, multi.

The model-based types (score_model, label_model) live in `openai_models`, the python
type in `openai_python`; `BUILDERS` here holds all of them, registered by
`rldojo.graders.load` (`loading`).

    {"type": "string_check", "name": "exact", "operation": "eq",
     "input": "{{sample.output_text}}", "reference": "{{item.answer}}"}
        -> 1.0 if the check holds, else 0.0 (operations: see `text_metrics`)

    {"type": "text_similarity", "name": "sim", "evaluation_metric": "fuzzy_match",
     "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "pass_threshold": 0.8}
        -> the metric in [0, 1]; with pass_threshold also components["pass"] (1.0 / 0.0).
        `cosine` needs an embedding model (`embedding = {...}` next to the spec).

    {"type": "multi", "name": "combo", "graders": {"a": {...}, "b": {...}},
     "calculate_output": "0.7 * a + 0.3 * b"}
        -> the formula over the sub-graders' values (`safe_expr`: + - * / ^, min, max,
        abs, floor, ceil, exp, sqrt, log). Any sub-grader failing fails the whole.

A template that does not resolve for a sample (``{{item.missing}}``) makes that sample's
score `invalid` with the template's field named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from rldojo.graders.base import Grader
from rldojo.graders.openai_templates import (
    TemplateError,
    check_template,
    item_view,
    render,
    sample_view,
)
from rldojo.graders.safe_expr import Expr, ExprError, compile_expr
from rldojo.graders.specs.common import GraderSpecError, check_keys, require
from rldojo.graders.specs.context import Builder, LoadContext
from rldojo.graders.specs.embedding import Embedder
from rldojo.graders.specs.openai_models import build_label_model, build_score_model
from rldojo.graders.specs.openai_python import build_python
from rldojo.graders.text_metrics import (
    SIMILARITY_METRICS,
    STRING_OPERATIONS,
    cosine_similarity,
    meteor_wordnet,
    similarity,
    string_check,
)
from rldojo.types import Rollout, Score, ScoreStatus, Task

__all__ = [
    "BUILDERS",
    "MultiGrader",
    "StringCheckGrader",
    "TextSimilarityGrader",
]

_SEVERITY: dict[ScoreStatus, int] = {"ok": 0, "invalid": 1, "timeout": 2, "error": 3}


def _provenance(grader: StringCheckGrader | TextSimilarityGrader | MultiGrader) -> dict[str, Any]:
    return {"grader": grader.name, "type": grader.type, "version": "openai-spec/1"}


def _render_pair(
    grader: StringCheckGrader | TextSimilarityGrader, rollout: Rollout, task: Task
) -> tuple[str, str]:
    sample, item = sample_view(rollout), item_view(task)
    text = render(grader.input, sample, item, field=f"{grader.path}.input")
    reference = render(grader.reference, sample, item, field=f"{grader.path}.reference")
    return text, reference


class StringCheckGrader:
    """`string_check`: 1.0 when `operation` holds between input and reference, else 0.0."""

    type = "string_check"

    def __init__(self, name: str, input: str, reference: str, operation: str, path: str) -> None:
        self.name, self.input, self.reference = name, input, reference
        self.operation, self.path = operation, path

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        try:
            text, reference = _render_pair(self, rollout, task)
        except TemplateError as exc:
            return Score.failed("invalid", str(exc), provenance=_provenance(self))
        passed = string_check(text, reference, self.operation)
        return Score(
            1.0 if passed else 0.0,
            explanation=f"{self.operation}: {'holds' if passed else 'does not hold'}",
            provenance=_provenance(self) | {"operation": self.operation},
        )


class TextSimilarityGrader:
    """`text_similarity`: the metric in [0, 1] (see `text_metrics`)."""

    type = "text_similarity"

    def __init__(
        self,
        name: str,
        input: str,
        reference: str,
        metric: str,
        path: str,
        *,
        pass_threshold: float | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.name, self.input, self.reference, self.metric = name, input, reference, metric
        self.path = path
        self.pass_threshold = pass_threshold
        self.embedder = embedder

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        provenance = _provenance(self) | {"evaluation_metric": self.metric}
        try:
            text, reference = _render_pair(self, rollout, task)
        except TemplateError as exc:
            return Score.failed("invalid", str(exc), provenance=provenance)
        if self.metric == "cosine":
            try:
                if self.embedder is None:
                    raise ValueError("the cosine metric needs an embedding model")
                a, b = await self.embedder.embed([text, reference])
            except Exception as exc:
                why = f"embedding call failed: {type(exc).__name__}: {exc}"
                return Score.failed("error", why, provenance=provenance)
            value = cosine_similarity(a, b)
            provenance["embedding_model"] = self.embedder.model
        else:
            value = similarity(self.metric, text, reference)
        if self.metric == "meteor":
            provenance["wordnet"] = meteor_wordnet()
        components: dict[str, float] = {}
        if self.pass_threshold is not None:
            components["pass"] = 1.0 if value >= self.pass_threshold else 0.0
        return Score(value, components=components, provenance=provenance)


class MultiGrader:
    """`multi`: named sub-graders combined by the `calculate_output` formula."""

    type = "multi"

    def __init__(self, name: str, graders: Mapping[str, Grader], expr: Expr) -> None:
        self.name = name
        self.graders = dict(graders)
        self.expr = expr

    async def _one(self, grader: Grader, rollout: Rollout, task: Task) -> Score:
        try:
            return await grader.grade(rollout, task)
        except Exception as exc:  # a grader that raises failed; it did not score 0
            return Score.failed("error", f"raised {type(exc).__name__}: {exc}")

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        names = list(self.graders)
        results = await asyncio.gather(*(self._one(self.graders[n], rollout, task) for n in names))
        scores = dict(zip(names, results, strict=True))
        provenance = _provenance(self) | {
            "calculate_output": self.expr.text,
            "parts": {n: dict(s.provenance) for n, s in scores.items()},
        }
        flags = tuple(dict.fromkeys(f for s in scores.values() for f in s.flags))
        failed = sorted(
            (n for n in names if not scores[n].ok), key=lambda n: -_SEVERITY[scores[n].status]
        )
        if failed:
            why = "; ".join(f"{n}: {scores[n].status}: {scores[n].explanation}" for n in failed)
            return Score.failed(scores[failed[0]].status, why, provenance=provenance, flags=flags)
        values = {n: float(s.value) for n, s in scores.items() if s.value is not None}
        try:
            value = self.expr.evaluate(values)
        except ExprError as exc:
            return Score.failed("invalid", str(exc), provenance=provenance, flags=flags)
        components = dict(values)
        for n, s in scores.items():
            components |= {f"{n}.{k}": float(v) for k, v in s.components.items()}
        return Score(value, components=components, flags=flags, provenance=provenance)


# ------------------------------------------------------------------------------ builders

_COMMON = ("type", "name")


def _name(spec: Mapping[str, Any], path: str) -> str:
    return str(require(spec, "name", str, path)) if "name" in spec else path.rsplit(".", 1)[-1]


def _choice(spec: Mapping[str, Any], key: str, options: tuple[str, ...], path: str) -> str:
    value = require(spec, key, str, path)
    if value not in options:
        raise GraderSpecError(f"{path}.{key}: expected one of {', '.join(options)}, got {value!r}")
    return str(value)


def _threshold(spec: Mapping[str, Any], path: str) -> float | None:
    if "pass_threshold" not in spec:
        return None
    return float(require(spec, "pass_threshold", (int, float), path))


def _templates(spec: Mapping[str, Any], path: str) -> tuple[str, str]:
    try:
        text = check_template(require(spec, "input", str, path), f"{path}.input")
        reference = check_template(require(spec, "reference", str, path), f"{path}.reference")
    except TemplateError as exc:
        raise GraderSpecError(str(exc)) from None
    return text, reference


def build_string_check(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(spec, (*_COMMON, "input", "reference", "operation"), path)
    operation = _choice(spec, "operation", STRING_OPERATIONS, path)
    text, reference = _templates(spec, path)
    return StringCheckGrader(_name(spec, path), text, reference, operation, path)


def build_text_similarity(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    allowed = (*_COMMON, "input", "reference", "evaluation_metric", "pass_threshold", "embedding")
    check_keys(spec, allowed, path)
    metric = _choice(spec, "evaluation_metric", SIMILARITY_METRICS, path)
    text, reference = _templates(spec, path)
    embedder = ctx.embedder(spec.get("embedding"), path) if metric == "cosine" else None
    return TextSimilarityGrader(
        _name(spec, path),
        text,
        reference,
        metric,
        path,
        pass_threshold=_threshold(spec, path),
        embedder=embedder,
    )


def build_multi(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(spec, (*_COMMON, "graders", "calculate_output"), path)
    subs = require(spec, "graders", dict, path)
    if not subs:
        raise GraderSpecError(f"{path}.graders: needs at least one grader")
    graders = {str(k): ctx.build(v, f"{path}.graders.{k}") for k, v in subs.items()}
    formula = require(spec, "calculate_output", str, path)
    try:
        expr = compile_expr(formula, graders)
    except ExprError as exc:
        raise GraderSpecError(f"{path}.calculate_output: {exc}") from None
    return MultiGrader(_name(spec, path), graders, expr)


BUILDERS: dict[str, Builder] = {
    "string_check": build_string_check,
    "text_similarity": build_text_similarity,
    "multi": build_multi,
    "score_model": build_score_model,
    "label_model": build_label_model,
    "python": build_python,
}
"""OpenAI grader type -> builder, registered by `rldojo.graders.load`."""
