"""Grader templates (``{{item.x}}``, ``{{sample.output_text}}``) and the item/sample views.

OpenAI's grader templates substitute ``{{ namespace.path }}`` with a value from one of two
namespaces:

    item     the dataset row (in rldojo: `task.info`, plus `answer`, `prompt` and `id`
             from the task when the row does not have them)
    sample   the model's output: `output_text`, `output_json` (the output parsed as JSON,
             when it is JSON), plus anything else the row's sample carries

Paths use dots and list indices: ``{{item.answers[0]}}``, ``{{sample.output_json.a.b}}``,
``{{item.rows.0.name}}``. Strings are substituted as they are; other values as JSON.
A path that does not resolve is a `TemplateError` naming the template's field and the
missing key — at grade time that sample's score is `invalid`, never a silent empty string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from rldojo.types import Rollout, Task

__all__ = [
    "TemplateError",
    "check_template",
    "item_view",
    "lookup",
    "render",
    "sample_view",
    "template_paths",
]

NAMESPACES = ("item", "sample")
_VAR = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class TemplateError(ValueError):
    """A template names an unknown namespace, a malformed path, or a missing value."""


def _parse_path(expr: str, field: str) -> tuple[str, list[str | int]]:
    text = expr.strip()
    if not text:
        raise TemplateError(f"{field}: empty template variable {{{{}}}}")
    parts: list[str | int] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "." and pos > 0:
            pos += 1
        m = _SEGMENT.match(text, pos)
        if m is None:
            raise TemplateError(f"{field}: malformed template variable {{{{{text}}}}}")
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    namespace = parts[0]
    if namespace not in NAMESPACES:
        raise TemplateError(
            f"{field}: {{{{{text}}}}}: unknown namespace {namespace!r} (use item or sample)"
        )
    if len(parts) < 2:
        raise TemplateError(f"{field}: {{{{{text}}}}} names a namespace, not a value")
    return str(namespace), parts[1:]


def template_paths(template: str, field: str) -> list[tuple[str, list[str | int]]]:
    """The (namespace, path) of every variable in `template`; TemplateError if malformed."""
    return [_parse_path(m.group(1), field) for m in _VAR.finditer(template)]


def check_template(template: object, field: str) -> str:
    """Validate at load time: `template` is a string whose variables are well formed."""
    if not isinstance(template, str):
        raise TemplateError(f"{field}: expected a string, got {type(template).__name__}")
    template_paths(template, field)
    return template


def lookup(
    namespace: str, path: list[str | int], sample: Mapping[str, Any], item: Mapping[str, Any]
) -> Any:
    """The value at `path` in the namespace; KeyError naming the missing part."""
    node: object = sample if namespace == "sample" else item
    walked = namespace
    for part in path:
        if isinstance(node, Mapping) and str(part) in node:
            node = node[str(part)]
        elif isinstance(node, list) and str(part).isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(f"{walked} has no {part!r}")
        walked += f".{part}"
    return node


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(
    template: str,
    sample: Mapping[str, Any],
    item: Mapping[str, Any],
    *,
    field: str = "template",
    wrap_sample: Callable[[str], str] | None = None,
) -> str:
    """Substitute every variable. `wrap_sample` (if given) wraps values from `sample`
    (the injection defence fences model output this way)."""

    def substitute(m: re.Match[str]) -> str:
        namespace, path = _parse_path(m.group(1), field)
        try:
            value = _as_text(lookup(namespace, path, sample, item))
        except KeyError as exc:
            raise TemplateError(f"{field}: {{{{{m.group(1).strip()}}}}}: {exc.args[0]}") from None
        if namespace == "sample" and wrap_sample is not None:
            return wrap_sample(value)
        return value

    return _VAR.sub(substitute, template)


def item_view(task: Task) -> dict[str, Any]:
    """The `item` namespace of a task: its info, plus answer/prompt/id when absent."""
    item = dict(task.info)
    if task.answer is not None:
        item.setdefault("answer", task.answer)
    if task.prompt:
        item.setdefault("prompt", task.prompt)
    if task.id:
        item.setdefault("id", task.id)
    return item


def sample_view(rollout: Rollout) -> dict[str, Any]:
    """The `sample` namespace of a rollout (see the module docstring)."""
    sample = dict(rollout.info.get("sample") or {})
    sample.setdefault("output_text", rollout.completion)
    if "output_json" not in sample:
        try:
            parsed = json.loads(rollout.completion)
        except (ValueError, TypeError):
            parsed = None
        sample["output_json"] = parsed if isinstance(parsed, dict | list) else None
    return sample
