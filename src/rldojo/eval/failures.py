"""Failure-mode analysis: group failed rollouts by why they failed, with counts and examples.

Input is one record per graded sample (`SampledEval.records`, or `records_from_ledger` for
a training run): rollout status and error, score status, value, components, flags,
explanation, completion and rollout info. A sample *failed* when it did not pass. Each
failed sample gets every cause that applies:

    rollout:<status>           the episode failed (env_error, timeout, policy_error, ...)
    error:<message>            its error message, numbers and quotes normalised
    grade:<status>             the grader failed (error, timeout, invalid)
    grade_error:<message>      the grader's explanation for that failure
    flag:<flag>                a grader flag (e.g. hack:test_tamper)
    component:<name>=0         a sub-score below 1 (e.g. component:format=0)
    tool:<key>                 a tool-call / parse error counted in the rollout info
    truncated                  a policy turn hit the token limit
    wrong_answer               graded fine, no other cause: the answer was just wrong

`group_failures` counts causes per environment, most frequent first, with a few example
samples each — the table that tells you what to fix next.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FailureGroup",
    "failure_causes",
    "failures_markdown",
    "failures_table",
    "group_failures",
    "records_from_ledger",
]

_NUMBER = re.compile(r"\b0x[0-9a-f]+\b|\d+(?:\.\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PATH = re.compile(r"(?:/[\w.\-]+){2,}")
_TOOL_KEYS = ("tool_error", "tool_errors", "parse_error", "parse_errors", "invalid_tool_call")


def normalise_message(text: str, limit: int = 80) -> str:
    """An error message with numbers, quoted strings and paths replaced, so alike group."""
    text = _PATH.sub("<path>", text)
    text = _QUOTED.sub("<str>", text)
    text = _NUMBER.sub("<n>", text)
    text = " ".join(text.split())
    return text[:limit]


def failure_causes(record: Mapping[str, Any]) -> list[str]:
    """Every cause of one failed sample (see the module docstring); [] if it passed."""
    if record.get("passed"):
        return []
    causes: list[str] = []
    status = record.get("status", "ok")
    if status not in ("ok", "truncated"):
        causes.append(f"rollout:{status}")
        if record.get("error"):
            causes.append(f"error:{normalise_message(str(record['error']))}")
    info = record.get("info") or {}
    if status == "truncated" or info.get("truncated_turns"):
        causes.append("truncated")
    score_status = record.get("score_status", "ok")
    if score_status != "ok" and status in ("ok", "truncated"):
        causes.append(f"grade:{score_status}")
        if record.get("explanation"):
            causes.append(f"grade_error:{normalise_message(str(record['explanation']))}")
    causes += [f"flag:{f}" for f in record.get("flags") or ()]
    for name, value in sorted((record.get("components") or {}).items()):
        if isinstance(value, int | float) and value < 1.0:
            causes.append(f"component:{name}=0" if value == 0 else f"component:{name}<1")
    causes += [f"tool:{key}" for key in _TOOL_KEYS if info.get(key)]
    if all(c.startswith("component:correct") for c in causes):
        causes.append("wrong_answer")  # graded fine, answer line present: just wrong
    return causes


@dataclass
class FailureGroup:
    """One cause in one environment: how many failed samples show it, and examples."""

    env: str
    cause: str
    count: int
    share: float
    """Of the environment's failed samples."""
    examples: list[dict[str, Any]] = field(default_factory=list)


def _example(record: Mapping[str, Any], chars: int) -> dict[str, Any]:
    completion = str(record.get("completion", ""))
    return {
        "task_id": record.get("task_id"),
        "completion": completion if len(completion) <= chars else completion[:chars] + "…",
        "explanation": record.get("explanation", ""),
        "error": record.get("error", ""),
    }


def group_failures(
    records: Iterable[Mapping[str, Any]], *, examples: int = 3, example_chars: int = 160
) -> list[FailureGroup]:
    """Failed samples grouped by (environment, cause), most frequent first."""
    groups: dict[tuple[str, str], FailureGroup] = {}
    failed_per_env: dict[str, int] = {}
    for record in records:
        causes = failure_causes(record)
        if not causes:
            continue
        env = str(record.get("env") or "env")
        failed_per_env[env] = failed_per_env.get(env, 0) + 1
        for cause in causes:
            group = groups.setdefault((env, cause), FailureGroup(env, cause, 0, 0.0))
            group.count += 1
            if len(group.examples) < examples:
                group.examples.append(_example(record, example_chars))
    for group in groups.values():
        group.share = group.count / failed_per_env[group.env]
    return sorted(groups.values(), key=lambda g: (-g.count, g.env, g.cause))


def failures_table(
    groups: Sequence[FailureGroup], *, top: int = 15, title: str = "failure modes"
) -> Any:
    """A rich table of the most frequent causes, one example completion each."""
    from rich.table import Table

    table = Table(title=f"{title} (failed samples)")
    for column in ("env", "cause", "count", "share", "example"):
        table.add_column(column, overflow="fold")
    for g in groups[:top]:
        example = g.examples[0]["completion"] if g.examples else ""
        example = example.replace("\n", "⏎ ")[:60]  # one line per cause
        table.add_row(g.env, g.cause, str(g.count), f"{g.share:.0%}", example)
    return table


def _cell(text: str) -> str:
    """Text as one Markdown table cell: quoted, newlines escaped, pipes escaped."""
    return json.dumps(text, ensure_ascii=False).replace("|", "\\|")


def failures_markdown(groups: Sequence[FailureGroup], *, top: int = 15) -> str:
    """The same table as Markdown, with up to three examples per cause."""
    lines = ["| env | cause | count | share | examples |", "|---|---|---:|---:|---|"]
    for g in groups[:top]:
        shown = "<br>".join(f"`{e['task_id']}`: {_cell(e['completion'][:80])}" for e in g.examples)
        lines.append(f"| {g.env} | `{g.cause}` | {g.count} | {g.share:.0%} | {shown} |")
    return "\n".join(lines)


def records_from_ledger(
    path: str | Path, *, step: int | None = None, pass_threshold: float = 1.0
) -> list[dict[str, Any]]:
    """Per-sample records of a run's ledger (a run directory or its ledger.sqlite)."""
    db_path = Path(path)
    if db_path.is_dir():
        db_path = db_path / "ledger.sqlite"
    if not db_path.exists():
        raise FileNotFoundError(f"no ledger at {db_path}")
    query = (
        "SELECT task_id, env, sample_index, status, error, score_value, score_status,"
        " components, flags, explanation, completion FROM rollouts"
    )
    params: tuple[Any, ...] = ()
    if step is not None:
        query, params = query + " WHERE step = ?", (step,)
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        rows = db.execute(query + " ORDER BY id", params).fetchall()
    records = []
    for task_id, env, sample, status, error, value, sstatus, comps, flags, expl, text in rows:
        components = json.loads(comps)
        ok = sstatus == "ok" and (
            components["correct"] >= 1.0
            if "correct" in components
            else (value or 0.0) >= pass_threshold
        )
        records.append(
            {
                "task_id": task_id,
                "env": env,
                "sample": sample,
                "status": status,
                "error": error,
                "score_status": sstatus,
                "value": value,
                "components": components,
                "flags": json.loads(flags),
                "explanation": expl,
                "completion": text,
                "passed": ok,
                "info": {},
            }
        )
    return records
