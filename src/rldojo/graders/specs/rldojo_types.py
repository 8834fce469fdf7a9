"""rldojo's own grader types for specs: rubric, group_judge, span_penalty, exact_match,
math_verify. They mix freely with the OpenAI types (e.g. inside a `multi`).

    [grader.spec]
    type = "rubric"
    judge = { base_url = "http://127.0.0.1:8000/v1", model = "smollm2-135m-instruct" }
    view = "trace"                          # or "final" (default)
    process_criteria = true                 # add TRACE_CRITERIA (wrong steps lose points)
    reference = "{{item.answer}}"           # optional; default: the task's answer
    sampling_params = { temperature = 0, max_tokens = 512, seed = 0 }
    criteria = [
      { id = "correct", text = "The final answer is correct", points = 5 },
      { id = "rude", text = "The response is rude", points = -2 },
    ]                                       # or criteria_field = "rubric" (per task)

    { type = "group_judge", judge = {...}, instructions = "...", group_size = 8 }

    { type = "span_penalty", tokenizer = "smollm2-135m-instruct",
      patterns = { "(?i)as an ai language model" = -0.5 }, grader = { ...inner spec... } }

    { type = "exact_match" }   { type = "math_verify", timeout_s = 5 }
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rldojo.graders.base import Grader
from rldojo.graders.judges.group import GroupJudgeGrader
from rldojo.graders.judges.rubric import TRACE_CRITERIA, RubricGrader, parse_criteria
from rldojo.graders.specs.common import GraderSpecError, check_keys, require
from rldojo.graders.specs.context import Builder, LoadContext
from rldojo.graders.token_rewards import SpanPenaltyGrader

__all__ = ["BUILDERS"]


def _sampling(spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    raw = spec.get("sampling_params", {})
    where = f"{path}.sampling_params"
    if not isinstance(raw, Mapping):
        raise GraderSpecError(f"{where}: expected a table")
    check_keys(raw, ("temperature", "max_tokens", "seed"), where)
    out: dict[str, Any] = {}
    if "temperature" in raw:
        out["temperature"] = float(require(raw, "temperature", (int, float), where))
    if "max_tokens" in raw:
        out["max_tokens"] = int(require(raw, "max_tokens", int, where))
    if "seed" in raw:
        out["seed"] = int(require(raw, "seed", int, where))
    return out


def _choice(
    spec: Mapping[str, Any], key: str, options: tuple[str, ...], default: str, path: str
) -> str:
    value = spec.get(key, default)
    if value not in options:
        raise GraderSpecError(f"{path}.{key}: expected one of {', '.join(options)}, got {value!r}")
    return str(value)


def _text(spec: Mapping[str, Any], key: str, path: str) -> str | None:
    return str(require(spec, key, str, path)) if key in spec else None


def build_rubric(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(
        spec,
        (
            "type",
            "name",
            "judge",
            "criteria",
            "criteria_field",
            "process_criteria",
            "reference",
            "instructions",
            "view",
            "sampling_params",
            "on_injection",
            "tokenizer",
            "pass_threshold",
        ),
        path,
    )
    criteria: list[Any] | None = None
    if "criteria" in spec:
        try:
            criteria = parse_criteria(spec["criteria"], f"{path}.criteria")
        except ValueError as exc:
            raise GraderSpecError(str(exc)) from None
    elif "criteria_field" not in spec:
        raise GraderSpecError(
            f"{path}.criteria: missing (or set criteria_field to read it per task)"
        )
    if spec.get("process_criteria", False):
        if criteria is None:
            raise GraderSpecError(f"{path}.process_criteria: needs criteria in the spec")
        criteria = [*criteria, *(c for c in TRACE_CRITERIA if c.id not in {x.id for x in criteria})]
    return RubricGrader(
        ctx.judge_client(spec.get("judge"), None, path),
        criteria,
        name=str(spec.get("name", "rubric")),
        reference=_text(spec, "reference", path),
        instructions=_text(spec, "instructions", path) or "",
        view=_choice(spec, "view", ("final", "trace"), "final", path),  # type: ignore[arg-type]
        criteria_field=str(spec.get("criteria_field", "rubric")),
        on_injection=_choice(spec, "on_injection", ("flag", "invalid"), "flag", path),  # type: ignore[arg-type]
        tokenizer=_text(spec, "tokenizer", path),
        pass_threshold=float(spec.get("pass_threshold", 1.0)),
        **_sampling(spec, path),
    )


def build_group_judge(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(
        spec,
        (
            "type",
            "name",
            "judge",
            "instructions",
            "reference",
            "view",
            "group_size",
            "gather_window_s",
            "shuffle",
            "sampling_params",
            "on_injection",
        ),
        path,
    )
    group_size = spec.get("group_size")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise GraderSpecError(f"{path}.group_size: expected a positive integer")
    return GroupJudgeGrader(
        ctx.judge_client(spec.get("judge"), None, path),
        name=str(spec.get("name", "group_judge")),
        instructions=_text(spec, "instructions", path) or "",
        reference=_text(spec, "reference", path),
        view=_choice(spec, "view", ("final", "trace"), "final", path),  # type: ignore[arg-type]
        group_size=group_size,
        gather_window_s=float(spec.get("gather_window_s", 0.25)),
        shuffle=bool(spec.get("shuffle", True)),
        on_injection=_choice(spec, "on_injection", ("flag", "invalid"), "flag", path),  # type: ignore[arg-type]
        **_sampling(spec, path),
    )


def build_span_penalty(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(spec, ("type", "name", "grader", "patterns", "tokenizer"), path)
    patterns = require(spec, "patterns", dict, path)
    for regex, reward in patterns.items():
        try:
            re.compile(regex)
        except re.error as exc:
            raise GraderSpecError(f"{path}.patterns: bad regex {regex!r}: {exc}") from None
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise GraderSpecError(f"{path}.patterns.{regex}: expected a number")
    inner = ctx.build(require(spec, "grader", dict, path), f"{path}.grader")
    tokenizer = require(spec, "tokenizer", str, path)
    return SpanPenaltyGrader(inner, patterns, tokenizer, name=str(spec.get("name", "span_penalty")))


def build_exact_match(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    from rldojo.graders.rules import ExactMatchGrader

    check_keys(spec, ("type", "name"), path)
    grader = ExactMatchGrader()
    grader.name = str(spec.get("name", grader.name))
    return grader


def build_math_verify(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    from rldojo.graders.rules import MathVerifyGrader

    check_keys(spec, ("type", "name", "timeout_s"), path)
    grader = MathVerifyGrader(timeout_s=float(spec.get("timeout_s", 5.0)))
    grader.name = str(spec.get("name", grader.name))
    return grader


BUILDERS: dict[str, Builder] = {
    "rubric": build_rubric,
    "group_judge": build_group_judge,
    "span_penalty": build_span_penalty,
    "exact_match": build_exact_match,
    "math_verify": build_math_verify,
}
"""rldojo grader type -> builder, registered by `rldojo.graders.load`."""
