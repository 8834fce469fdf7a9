"""Up-front checks of a grader spec's templates against the data it will grade.

A template variable that resolves in none of the rows (``{{sample.output_txt}}``,
``{{item.answr}}``) would make every score `invalid`; `check_spec_templates` finds it
before any grading starts and names the spec field, the variable, the missing key and
the keys that are there (with the closest one as a hint). A variable that resolves in
some rows but not others is left to grading time: those rows are `invalid` one by one.

Templates are every string holding ``{{`` anywhere in the spec, except a python
grader's `source` (code, where ``{{`` is ordinary syntax).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rldojo.graders.openai_templates import TemplateError, lookup, template_paths

__all__ = ["check_spec_templates", "spec_templates"]

_NOT_TEMPLATES = ("source",)


def spec_templates(spec: object, path: str = "spec") -> Iterator[tuple[str, str]]:
    """`(field path, template)` of every templated string in a spec (dicts and lists)."""
    if isinstance(spec, str):
        if "{{" in spec:
            yield path, spec
    elif isinstance(spec, Mapping):
        for key, value in spec.items():
            if key not in _NOT_TEMPLATES:
                yield from spec_templates(value, f"{path}.{key}")
    elif isinstance(spec, list):
        for i, value in enumerate(spec):
            yield from spec_templates(value, f"{path}[{i}]")


def _missing(
    namespace: str, parts: list[str | int], views: Sequence[tuple[Mapping[str, Any], ...]]
) -> str | None:
    """None when the path resolves in some view; else why not, from the first view."""
    first_error = ""
    for sample, item in views:
        try:
            lookup(namespace, parts, sample, item)
            return None
        except KeyError as exc:
            first_error = first_error or str(exc.args[0])
    sample, item = views[0]
    node: object = sample if namespace == "sample" else item
    for part in parts:  # walk to the level where the path stops, to list what is there
        if isinstance(node, Mapping) and str(part) in node:
            node = node[str(part)]
            continue
        if isinstance(node, Mapping):
            keys = sorted(str(k) for k in node)
            close = difflib.get_close_matches(str(part), keys, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            shown = ", ".join(keys[:12]) + (", ..." if len(keys) > 12 else "")
            return f"{first_error} (it has: {shown}){hint}"
        break
    return first_error


def check_spec_templates(
    spec: Mapping[str, Any],
    views: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    where: str,
    *,
    sample_keys: Sequence[str] | None = None,
) -> None:
    """TemplateError naming the first variable that resolves in none of `views`.

    `views` are `(sample, item)` namespaces as graders see them (`sample_view`,
    `item_view`); `where` names them in the message ("the 40 rows of data.jsonl").
    With `sample_keys` (before sampling, when there is no model output yet) a `sample`
    path is checked only for its first key being one of them.
    """
    if not views:
        return
    for field, template in spec_templates(spec):
        for namespace, parts in template_paths(template, field):
            if namespace == "sample" and sample_keys is not None:
                key_views: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = [
                    (dict.fromkeys(sample_keys), {})
                ]
                why = _missing(namespace, parts[:1], key_views)
            else:
                why = _missing(namespace, parts, views)
            if why is not None:
                variable = namespace + "".join(
                    f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts
                )
                raise TemplateError(
                    f"{field}: {{{{{variable}}}}} resolves in none of {where}: {why}"
                )
