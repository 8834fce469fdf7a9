"""OpenAI's model-based grader types, answered by any judge backend.

    {"type": "score_model", "name": "quality", "model": "gpt-4o-2024-08-06",
     "input": [{"role": "system", "content": "Rate the answer ..."},
               {"role": "user", "content": "Reference: {{item.answer}}\\n"
                                           "Answer: {{sample.output_text}}"}],
     "range": [0, 1], "pass_threshold": 0.5,
     "sampling_params": {"temperature": 0, "seed": 42, "max_completions_tokens": 512}}
        -> the judge's `result`, a number within `range`
           (components: "score"; "pass" = 1.0 / 0.0 when pass_threshold is set)

    {"type": "label_model", "name": "tone", "model": "...", "input": [...],
     "labels": ["polite", "rude"], "passing_labels": ["polite"]}
        -> 1.0 if the judge's label is a passing label, else 0.0 (label in provenance)

`model` names the judge; which endpoint answers for it comes from the spec's `judge`
table (which may also rename the model, e.g. to a local `rldojo serve`). Messages may use
``{{item.*}}`` / ``{{sample.*}}`` templates; content may be a string or OpenAI content
parts (``{"type": "input_text", "text": ...}``). Values from `sample` are fenced as data
(`fence_sample = false` turns that off) and a system instruction asks for strict JSON
echoing the sample's nonce; a bad reply is repaired once, then the score is `invalid`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from rldojo.graders.base import Grader
from rldojo.graders.judges.client import (
    JudgeClient,
    JudgeError,
    JudgeRequest,
    ask_verdict,
    judge_failure,
)
from rldojo.graders.judges.injection import (
    DATA_RULES,
    INJECTION_FLAG,
    VerdictError,
    detect_injection,
    extract_verdict,
    fence,
    nonce_for,
)
from rldojo.graders.openai_templates import (
    TemplateError,
    check_template,
    item_view,
    render,
    sample_view,
)
from rldojo.graders.specs.common import GraderSpecError, check_keys, require
from rldojo.graders.specs.context import LoadContext
from rldojo.types import Message, Rollout, Score, Task

__all__ = ["ModelGrader", "build_label_model", "build_score_model"]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _content_text(content: object, path: str) -> str:
    """A message's content as one template string (strings or OpenAI content parts)."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
            raise GraderSpecError(f"{path}[{i}]: only text content is supported")
        texts.append(part["text"])
    return "".join(texts)


def parse_messages(raw: object, path: str) -> list[Message]:
    """The `input` message list with validated roles and templates."""
    if not isinstance(raw, list) or not raw:
        raise GraderSpecError(f"{path}: expected a non-empty list of messages")
    out: list[Message] = []
    for i, message in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(message, Mapping):
            raise GraderSpecError(f"{where}: expected a message table")
        check_keys(message, ("role", "content", "type"), where)
        role = require(message, "role", str, where)
        if role not in _ROLES:
            raise GraderSpecError(f"{where}.role: expected one of {', '.join(_ROLES)}")
        text = _content_text(message.get("content"), f"{where}.content")
        try:
            check_template(text, f"{where}.content")
        except TemplateError as exc:
            raise GraderSpecError(str(exc)) from None
        out.append({"role": _ROLES[role], "content": text})
    return out


V = TypeVar("V")
"""A judge's parsed verdict: a score's number, a label."""


class ModelGrader(Generic[V]):
    """Shared machinery of score_model and label_model: render, fence, ask, parse."""

    type = "model"
    output_rule = ""

    def __init__(
        self,
        name: str,
        messages: Sequence[Message],
        judge: JudgeClient,
        path: str,
        *,
        sampling: Mapping[str, Any],
        fence_sample: bool = True,
    ) -> None:
        self.name, self.messages, self.judge, self.path = name, list(messages), judge, path
        self.sampling = dict(sampling)
        self.fence_sample = fence_sample
        template = json.dumps([self.messages, self.output_rule, fence_sample, self.type])
        self.template_hash = hashlib.sha256(template.encode()).hexdigest()[:16]

    def build_request(self, rollout: Rollout, task: Task) -> tuple[JudgeRequest, str]:
        sample, item = sample_view(rollout), item_view(task)
        nonce = nonce_for(self.template_hash, json.dumps(sample, sort_keys=True, default=str))
        wrap = (
            (lambda text: "\n" + fence(text, "SAMPLE", nonce) + "\n") if self.fence_sample else None
        )
        rendered = [
            {
                "role": m["role"],
                "content": render(
                    m["content"], sample, item, field=f"{self.path}.input[{i}]", wrap_sample=wrap
                ),
            }
            for i, m in enumerate(self.messages)
        ]
        rule = self.rule(nonce)
        if self.fence_sample:
            rule = DATA_RULES + "\n" + rule
        if rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": rendered[0]["content"] + "\n\n" + rule}
        else:
            rendered.insert(0, {"role": "system", "content": rule})
        extra = {k: v for k, v in self.sampling.items() if k == "reasoning_effort"}
        request = JudgeRequest(
            rendered,
            temperature=float(self.sampling.get("temperature", 0.0)),
            top_p=float(self.sampling.get("top_p", 1.0)),
            max_tokens=int(self.sampling.get("max_tokens", 512)),
            seed=self.sampling.get("seed", 0),
            extra=extra,
        )
        return request, nonce

    def rule(self, nonce: str) -> str:
        """The output-format instruction for this sample."""
        return self.output_rule.replace("@NONCE@", nonce)

    def parse(self, reply: str, nonce: str) -> V:
        raise NotImplementedError

    def to_score(self, value: V, provenance: dict[str, Any], flags: tuple[str, ...]) -> Score:
        raise NotImplementedError

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        provenance: dict[str, Any] = {"grader": self.name, "type": self.type}
        suspicious = detect_injection(rollout.completion)
        flags = (INJECTION_FLAG,) if suspicious else ()
        try:
            request, nonce = self.build_request(rollout, task)
        except TemplateError as exc:
            return Score.failed("invalid", str(exc), provenance=provenance, flags=flags)
        provenance |= self.judge.provenance(request, self.template_hash)
        provenance |= {"sample_id": nonce, "injection_patterns": suspicious}
        try:
            verdict = await ask_verdict(
                self.judge,
                request,
                self.template_hash,
                lambda reply: self.parse(reply, nonce),
                lambda error: f"Your reply could not be used: {error}. {self.rule(nonce)}",
            )
        except JudgeError as exc:
            return judge_failure(exc, provenance, flags)
        provenance |= {"attempts": verdict.attempts, "cache_hit": verdict.cached}
        if verdict.value is None:
            return Score.failed("invalid", verdict.error, provenance=provenance, flags=flags)
        return self.to_score(verdict.value, provenance, flags)


class ScoreModelGrader(ModelGrader[float]):
    """`score_model`: a number within `range` from the judge."""

    type = "score_model"

    def __init__(
        self, *args: Any, range: tuple[float, float], pass_threshold: float | None, **kw: Any
    ) -> None:
        self.range = range
        self.pass_threshold = pass_threshold
        lo, hi = range
        self.output_rule = (
            f'Reply with only a JSON object: {{"sample_id": "@NONCE@", "result": <a number '
            f'from {lo:g} to {hi:g}>, "steps": [{{"description": "...", "conclusion": "..."}}]}}'
        )
        super().__init__(*args, **kw)

    def parse(self, reply: str, nonce: str) -> float:
        obj = extract_verdict(reply, id_key="sample_id", nonce=nonce)
        result = obj.get("result")
        if (
            isinstance(result, bool)
            or not isinstance(result, int | float)
            or not math.isfinite(result)
        ):
            raise VerdictError('"result" must be a number')
        lo, hi = self.range
        if not lo <= result <= hi:
            raise VerdictError(f'"result" {result} is outside the range [{lo:g}, {hi:g}]')
        return float(result)

    def to_score(self, value: float, provenance: dict[str, Any], flags: tuple[str, ...]) -> Score:
        components = {"score": value}
        if self.pass_threshold is not None:
            components["pass"] = 1.0 if value >= self.pass_threshold else 0.0
        return Score(value, components=components, flags=flags, provenance=provenance)


class LabelModelGrader(ModelGrader[str]):
    """`label_model`: 1.0 when the judge's label is one of `passing_labels`."""

    type = "label_model"
    pass_threshold = 1.0

    def __init__(self, *args: Any, labels: list[str], passing: list[str], **kw: Any) -> None:
        self.labels, self.passing = labels, passing
        self.output_rule = (
            'Reply with only a JSON object: {"sample_id": "@NONCE@", "label": <one of '
            + json.dumps(labels)
            + ">}"
        )
        super().__init__(*args, **kw)

    def parse(self, reply: str, nonce: str) -> str:
        obj = extract_verdict(reply, id_key="sample_id", nonce=nonce)
        label = obj.get("label", obj.get("result"))
        if label not in self.labels:
            raise VerdictError(f'"label" must be one of {self.labels}, got {label!r}')
        return str(label)

    def to_score(self, value: str, provenance: dict[str, Any], flags: tuple[str, ...]) -> Score:
        passed = 1.0 if value in self.passing else 0.0
        provenance["label"] = value
        return Score(
            passed,
            components={"pass": passed},
            flags=flags,
            explanation=f"label: {value}",
            provenance=provenance,
        )


# ------------------------------------------------------------------------------ builders

_MODEL_KEYS = ("type", "name", "model", "input", "sampling_params", "judge", "fence_sample")
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "seed",
    "max_completions_tokens",
    "max_completion_tokens",
    "max_tokens",
    "reasoning_effort",
)


def _sampling(spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    raw = spec.get("sampling_params", {})
    where = f"{path}.sampling_params"
    if not isinstance(raw, Mapping):
        raise GraderSpecError(f"{where}: expected a table")
    check_keys(raw, _SAMPLING_KEYS, where)
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p"):
        if key in raw:
            out[key] = float(require(raw, key, (int, float), where))
    if "seed" in raw:
        out["seed"] = int(require(raw, "seed", int, where))
    for key in ("max_completions_tokens", "max_completion_tokens", "max_tokens"):
        if key in raw:
            out["max_tokens"] = int(require(raw, key, int, where))
    if "reasoning_effort" in raw:
        out["reasoning_effort"] = str(raw["reasoning_effort"])
    return out


def _common(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> tuple[Any, ...]:
    model = require(spec, "model", str, path)
    messages = parse_messages(require(spec, "input", list, path), f"{path}.input")
    judge = ctx.judge_client(spec.get("judge"), model, path)
    name = str(spec.get("name", path.rsplit(".", 1)[-1]))
    fence_sample = bool(spec.get("fence_sample", True))
    return name, messages, judge, path, _sampling(spec, path), fence_sample


def build_score_model(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(spec, (*_MODEL_KEYS, "range", "pass_threshold"), path)
    raw_range = spec.get("range", [0, 1])
    if (
        not isinstance(raw_range, list)
        or len(raw_range) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw_range)
        or raw_range[0] >= raw_range[1]
    ):
        raise GraderSpecError(f"{path}.range: expected [low, high] with low < high")
    threshold = spec.get("pass_threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, int | float)
    ):
        raise GraderSpecError(f"{path}.pass_threshold: expected a number")
    name, messages, judge, path, sampling, fence_sample = _common(spec, ctx, path)
    return ScoreModelGrader(
        name,
        messages,
        judge,
        path,
        sampling=sampling,
        fence_sample=fence_sample,
        range=(float(raw_range[0]), float(raw_range[1])),
        pass_threshold=None if threshold is None else float(threshold),
    )


def build_label_model(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(spec, (*_MODEL_KEYS, "labels", "passing_labels"), path)
    labels = require(spec, "labels", list, path)
    passing = require(spec, "passing_labels", list, path)
    if not labels or not all(isinstance(x, str) and x for x in labels):
        raise GraderSpecError(f"{path}.labels: expected a non-empty list of strings")
    if len(set(labels)) != len(labels):
        raise GraderSpecError(f"{path}.labels: duplicate label")
    strange = [x for x in passing if x not in labels]
    if not passing or strange:
        raise GraderSpecError(
            f"{path}.passing_labels: must be a non-empty subset of labels"
            + (f" ({strange[0]!r} is not a label)" if strange else "")
        )
    name, messages, judge, path, sampling, fence_sample = _common(spec, ctx, path)
    return LabelModelGrader(
        name,
        messages,
        judge,
        path,
        sampling=sampling,
        fence_sample=fence_sample,
        labels=[str(x) for x in labels],
        passing=[str(x) for x in passing],
    )
