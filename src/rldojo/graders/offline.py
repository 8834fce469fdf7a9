"""Offline grading: a file of (item, sample) rows in, scored rows and a summary out.

This is the automated-grading stage of a reinforcement-fine-tuning service, and what
`rldojo grade` runs. Rows follow OpenAI's eval data shape:

    {"item": {"question": "...", "answer": "12", ...},      # the dataset row
     "sample": {"output_text": "...", "output_json": {...}}} # the model's output

Each row becomes a `Task` (``info`` = the item; ``answer``/``prompt``/``id`` taken from
the item when present) and a `Rollout` (``completion`` = ``output_text``), so every
rldojo grader works on files as it does in training. Graders that judge whole groups
(`GroupJudgeGrader`) get the rows that share an item as one group.

The summary: rows, statuses, mean score and pass rate over `ok` rows, per-component
means, flags, judge calls and cache hits (hit rate), wall time and samples/s.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rldojo.data.loading import DataError, read_rows, require_field
from rldojo.graders.base import Grader, judges_groups
from rldojo.types import Rollout, Score, Task

if TYPE_CHECKING:  # a type only: `judges.meta_eval` imports this module
    from rldojo.graders.judges.client import JudgeStats

__all__ = [
    "GradeRow",
    "check_row_templates",
    "grade_rows",
    "read_grade_rows",
    "row_task_rollout",
    "score_json",
    "summarize",
    "write_scored",
]


@dataclass(frozen=True)
class GradeRow:
    line: int
    item: dict[str, Any]
    sample: dict[str, Any]
    raw: dict[str, Any]


def read_grade_rows(path: str | os.PathLike[str]) -> list[GradeRow]:
    """Every row of `path`, checked; `DataError` names the file, line and field."""
    rows = []
    for line, row in read_rows(path):
        item = require_field(row, "item", path, line, (dict,))
        sample = dict(require_field(row, "sample", path, line, (dict,)))
        if "output_text" not in sample and isinstance(sample.get("output_json"), dict | list):
            sample["output_text"] = json.dumps(sample["output_json"])
        if not isinstance(sample.get("output_text"), str):
            raise DataError(path, line, "field 'sample.output_text': missing or not a string")
        rows.append(GradeRow(line, dict(item), sample, row))
    return rows


def _item_id(item: dict[str, Any]) -> str:
    if isinstance(item.get("id"), str | int):
        return str(item["id"])
    blob = json.dumps(item, sort_keys=True, default=str)
    return "item-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def row_task_rollout(row: GradeRow, index: int = 0) -> tuple[Task, Rollout]:
    """The (task, rollout) a grader sees for one file row."""
    item = row.item
    prompt = item.get("prompt", item.get("question", ""))
    if not isinstance(prompt, str | list):
        prompt = json.dumps(prompt)
    answer = item.get("answer", item.get("reference_answer"))
    task = Task(
        id=_item_id(item),
        prompt=prompt,
        answer=None if answer is None else str(answer),
        info=item,
        env="offline",
    )
    text = row.sample["output_text"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) and prompt else []
    rollout = Rollout(
        task_id=task.id,
        env="offline",
        messages=[*messages, {"role": "assistant", "content": text}],
        completion=text,
        sample_index=index,
        info={"sample": row.sample, "line": row.line},
    )
    return task, rollout


def check_row_templates(grader: Grader, rows: Sequence[GradeRow], where: str) -> None:
    """`TemplateError` if a template of the grader's spec resolves in none of `rows`
    (`rldojo.graders.template_check`); graders without a spec are not checked."""
    from rldojo.graders.openai_templates import item_view, sample_view
    from rldojo.graders.template_check import check_spec_templates

    spec = getattr(grader, "spec", None)
    if not spec:
        return
    pairs = [row_task_rollout(row) for row in rows]
    views = [(sample_view(r), item_view(t)) for t, r in pairs]
    check_spec_templates(spec, views, f"the {len(rows)} rows of {where}")


async def _bounded(
    coro: Awaitable[Sequence[Score]], gate: asyncio.Semaphore, timeout_s: float, n: int
) -> list[Score]:
    async with gate:
        try:
            return list(await asyncio.wait_for(coro, timeout_s))
        except TimeoutError:
            return [Score.failed("timeout", f"grading took longer than {timeout_s:g}s")] * n
        except Exception as exc:  # a grader that raises failed; it did not score 0
            return [Score.failed("error", f"grader raised {type(exc).__name__}: {exc}")] * n


async def _one(grader: Grader, rollout: Rollout, task: Task) -> list[Score]:
    return [await grader.grade(rollout, task)]


async def grade_rows(
    grader: Grader,
    rows: Sequence[GradeRow],
    *,
    concurrency: int = 8,
    timeout_s: float = 300.0,
    on_done: Callable[[int], None] | None = None,
) -> list[Score]:
    """One score per row, in order; `on_done(k)` after each k rows finish."""
    pairs = [row_task_rollout(row, i) for i, row in enumerate(rows)]
    units: list[tuple[list[int], Coroutine[object, object, list[Score]]]] = []
    if judges_groups(grader):
        groups: dict[str, list[int]] = defaultdict(list)
        for i, (task, _) in enumerate(pairs):
            groups[task.id].append(i)
        for idx in groups.values():
            call = grader.grade_group([pairs[i][1] for i in idx], pairs[idx[0]][0])
            units.append((idx, call))
    else:
        units = [([i], _one(grader, rollout, task)) for i, (task, rollout) in enumerate(pairs)]
    gate = asyncio.Semaphore(concurrency)
    scores: list[Score | None] = [None] * len(rows)

    async def run(idx: list[int], call: Awaitable[list[Score]]) -> None:
        for i, score in zip(idx, await _bounded(call, gate, timeout_s, len(idx)), strict=True):
            scores[i] = score
        if on_done is not None:
            on_done(len(idx))

    await asyncio.gather(*(run(idx, call) for idx, call in units))
    return [s for s in scores if s is not None]


def score_json(score: Score) -> dict[str, Any]:
    out: dict[str, Any] = {
        "value": score.value,
        "status": score.status,
        "components": dict(score.components),
        "flags": list(score.flags),
        "explanation": score.explanation,
        "provenance": dict(score.provenance),
    }
    if score.token_rewards is not None:
        out["token_rewards"] = list(score.token_rewards)
    return out


def write_scored(
    path: str | os.PathLike[str], rows: Sequence[GradeRow], scores: Sequence[Score]
) -> None:
    """Each input row with its ``"score"`` added, as JSON lines (written atomically)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    with tmp.open("w") as f:
        for row, score in zip(rows, scores, strict=True):
            f.write(json.dumps({**row.raw, "score": score_json(score)}, default=str) + "\n")
    tmp.replace(target)


def summarize(
    scores: Sequence[Score],
    *,
    pass_threshold: float = 1.0,
    stats: JudgeStats | None = None,
    wall_s: float | None = None,
) -> dict[str, Any]:
    """Mean, pass rate, statuses, per-component means, flags and judge cache figures."""
    ok = [s for s in scores if s.ok and s.value is not None]
    components: dict[str, list[float]] = defaultdict(list)
    for s in ok:
        for name, value in s.components.items():
            components[name].append(float(value))
    out: dict[str, Any] = {
        "rows": len(scores),
        "statuses": dict(Counter(s.status for s in scores)),
        "mean": sum(float(s.value or 0.0) for s in ok) / len(ok) if ok else None,
        "pass_threshold": pass_threshold,
        "pass_rate": sum(float(s.value or 0.0) >= pass_threshold for s in ok) / len(ok)
        if ok
        else None,
        "components": {k: sum(v) / len(v) for k, v in sorted(components.items())},
        "flags": dict(Counter(f for s in scores for f in s.flags)),
    }
    if stats is not None:
        out["judge"] = {
            "calls": stats.calls,
            "cache_hits": stats.cache_hits,
            "cache_hit_rate": stats.hit_rate,
            "failures": stats.failures,
        }
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 3)
        out["samples_per_s"] = round(len(scores) / wall_s, 3) if wall_s > 0 else None
    return out
