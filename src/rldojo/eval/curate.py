"""Difficulty curation: keep the tasks the current model solves sometimes, not never, not always.

RL learns only from groups whose rewards differ, so a task the model always or never
solves costs rollouts and teaches nothing. `estimate_pass_rates` samples each task K
times with the model, grades every sample with the task's environment grader, and
`Band` keeps the tasks whose estimated pass rate lies in a chosen interval (default the
open interval (0, 1)).

Model calls are the cost, so sampling can run in `rounds`: after each round a task whose
band membership can no longer change (e.g. one pass and one fail already seen, for the
band (0, 1)) stops being sampled. Its estimate then rests on fewer samples, which is
recorded. Failed samples (rollout or grader failure) are counted, never taken as fails.

Task files are JSON lines of serialised tasks (`task_row` writes them; `load_tasks`
reads them): ``{"id", "prompt" | "problem" | "question", "answer", "info", "env"}``.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rldojo.data.loading import DataError, read_rows, require_any_field
from rldojo.envs.base import Env
from rldojo.eval.harness import passed
from rldojo.policy.base import Policy
from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
from rldojo.types import SamplingParams, Task

__all__ = [
    "Band",
    "PassRate",
    "estimate_pass_rates",
    "histogram",
    "load_tasks",
    "load_texts",
    "task_row",
]


@dataclass(frozen=True)
class Band:
    """An interval of pass rates; ``Band.parse("(0,1)")``, ``"[0.1,0.7]"``, ``"0.1-0.7"``."""

    low: float = 0.0
    high: float = 1.0
    include_low: bool = False
    include_high: bool = False

    def contains(self, rate: float) -> bool:
        above = rate >= self.low if self.include_low else rate > self.low
        below = rate <= self.high if self.include_high else rate < self.high
        return above and below

    @classmethod
    def parse(cls, text: str) -> Band:
        """Interval notation with ( ) open and [ ] closed ends; a bare ``a-b`` is closed."""
        m = re.fullmatch(r"\s*([(\[]?)\s*([\d.]+)\s*[,-]\s*([\d.]+)\s*([)\]]?)\s*", text)
        if not m or bool(m.group(1)) != bool(m.group(4)):
            raise ValueError(f"band {text!r}: use e.g. '(0,1)', '[0.1,0.7]' or '0.1-0.7'")
        low, high = float(m.group(2)), float(m.group(3))
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"band {text!r}: need 0 <= low <= high <= 1")
        return cls(low, high, m.group(1) != "(", m.group(4) != ")")

    def __str__(self) -> str:
        left, right = "[" if self.include_low else "(", "]" if self.include_high else ")"
        return f"{left}{self.low:g}, {self.high:g}{right}"


@dataclass
class PassRate:
    """The estimate for one task: `passes` of `samples` graded samples, `failed` not graded."""

    task: Task
    samples: int = 0
    passes: int = 0
    failed: int = 0
    reward_sum: float = 0.0
    drawn: int = 0

    @property
    def rate(self) -> float | None:
        return self.passes / self.samples if self.samples else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.samples if self.samples else None

    def decided(self, band: Band, target: int) -> bool:
        """Whether further samples (up to `target` drawn) cannot change band membership."""
        remaining = max(0, target - self.drawn)
        total = self.samples + remaining
        if total == 0:
            return False
        inside = {band.contains(c / total) for c in range(self.passes, self.passes + remaining + 1)}
        return len(inside) == 1


def _factory(env_for: Callable[[str], Env], env_id: str) -> Callable[[], Env]:
    """A fresh environment per episode (a zero-argument factory, as the engine expects)."""
    return lambda: env_for(env_id)


async def estimate_pass_rates(
    tasks: Sequence[Task],
    policy: Policy,
    env_for: Callable[[str], Env],
    sampling: SamplingParams,
    *,
    samples: int = 8,
    band: Band | None = None,
    rounds: int = 1,
    seed: int = 0,
    grade_timeout_s: float = 30.0,
) -> list[PassRate]:
    """Sample each task up to `samples` times and grade; in order of `tasks`.

    `env_for(env_id)` builds a fresh environment (its default grader grades the task).
    With `rounds` > 1 and a `band`, tasks whose membership is decided stop early.
    """
    if samples < 1 or rounds < 1:
        raise ValueError(f"need samples >= 1 and rounds >= 1, got {samples}, {rounds}")
    estimates = [PassRate(task) for task in tasks]
    graders = {env_id: env_for(env_id).default_grader() for env_id in {t.env for t in tasks}}
    per_round = math.ceil(samples / rounds)
    for rnd in range(rounds):
        live = [
            (i, e)
            for i, e in enumerate(estimates)
            if e.drawn < samples and not (rnd and band is not None and e.decided(band, samples))
        ]
        for env_id in sorted({e.task.env for _, e in live}):
            group = [(i, e) for i, e in live if e.task.env == env_id]
            owners = [e for _, e in group for _ in range(min(per_round, samples - e.drawn))]
            requests = [
                (e.task, e.drawn + j, seed + i * samples + e.drawn + j)
                for i, e in group
                for j in range(min(per_round, samples - e.drawn))
            ]
            params = replace(sampling, seed=seed + 7919 * rnd)
            rollouts = await collect_rollouts(_factory(env_for, env_id), policy, requests, params)
            scores = await grade_rollouts(
                graders[env_id], rollouts, [t for t, _, _ in requests], timeout_s=grade_timeout_s
            )
            for est, score in zip(owners, scores, strict=True):
                est.drawn += 1
                if not score.ok:
                    est.failed += 1
                    continue
                est.samples += 1
                est.passes += passed(score)
                est.reward_sum += float(score.value or 0.0)
    return estimates


def histogram(estimates: Sequence[PassRate], bins: int = 10) -> list[tuple[str, int]]:
    """Tasks per pass rate: one row per value c/K when every task has K samples (K <= 20),
    else `bins` equal-width bins; tasks without a graded sample are counted as "n/a"."""
    rates = [e.rate for e in estimates if e.rate is not None]
    sizes = {e.samples for e in estimates if e.samples}
    rows: list[tuple[str, int]]
    if len(sizes) == 1 and (k := next(iter(sizes))) <= 20:
        rows = [
            (f"{c}/{k}", sum(e.passes == c for e in estimates if e.samples)) for c in range(k + 1)
        ]
    else:
        edges = [i / bins for i in range(bins + 1)]
        rows = []
        for lo, hi in itertools.pairwise(edges):
            last = hi == 1.0
            count = sum(lo <= r < hi or (last and r == 1.0) for r in rates)
            rows.append((f"{lo:.1f}-{hi:.1f}", count))
    missing = sum(e.rate is None for e in estimates)
    return rows + ([("n/a", missing)] if missing else [])


def histogram_text(rows: Sequence[tuple[str, int]], width: int = 40) -> str:
    """The histogram as text bars."""
    top = max((n for _, n in rows), default=0) or 1
    label_w = max((len(label) for label, _ in rows), default=1)
    return "\n".join(
        f"{label:>{label_w}} {n:5d} {'█' * round(width * n / top)}" for label, n in rows
    )


def task_row(task: Task, **extra: object) -> dict[str, Any]:
    """A task as a JSON-able row (the format `load_tasks` reads), plus `extra` fields.

    A task with `info["question"]` also gets a top-level ``question``, so the file trains
    directly as ``math-v1`` with ``path=FILE, prompt_field="question"``.
    """
    prompt = task.prompt if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]
    row: dict[str, Any] = {"id": task.id, "prompt": prompt, "answer": task.answer}
    if isinstance(task.info.get("question"), str):
        row["question"] = task.info["question"]  # so math-v1 (prompt_field="question") reads it
    return row | {"info": dict(task.info), "env": task.env} | extra


def _prompt(
    row: dict[str, Any], env: Env | None, path: str, line: int
) -> tuple[Any, dict[str, Any]]:
    if isinstance(row.get("prompt"), list):
        return row["prompt"], {}
    field, text = require_any_field(row, ("prompt", "problem", "question"), path, line)
    if field == "prompt":
        return text, {}
    instruction = getattr(env, "answer_format", None)
    return (f"{text}\n{instruction}" if instruction else text), {"question": text}


def load_tasks(
    path: str | os.PathLike[str], default_env: str, env_for: Callable[[str], Env] | None = None
) -> list[Task]:
    """Tasks from a JSONL/JSON/Parquet file (see the module docstring).

    Rows without ``env`` get `default_env`. A bare ``problem``/``question`` gets the
    environment's answer instruction appended (its `answer_format`) and is kept as
    ``info["question"]``. Bad rows raise `DataError` naming the file, line and field.
    """
    source = os.fspath(path)
    envs: dict[str, Env | None] = {}
    known = {"id", "prompt", "problem", "question", "answer", "info", "env"}
    tasks, seen = [], set()
    for line, row in read_rows(source):
        env_id = str(row.get("env") or default_env)
        if env_id not in envs:
            envs[env_id] = env_for(env_id) if env_for is not None else None
        prompt, info = _prompt(row, envs[env_id], source, line)
        if row.get("info") is not None and not isinstance(row["info"], dict):
            raise DataError(source, line, "field 'info': expected object")
        info = {
            **{k: v for k, v in row.items() if k not in known},
            **(row.get("info") or {}),
            **info,
        }
        ident = str(row.get("id") or f"{Path(source).name}:{line}")
        if ident in seen:
            raise DataError(source, line, f"field 'id': duplicate id {ident!r}")
        seen.add(ident)
        answer = row.get("answer")
        tasks.append(Task(ident, prompt, None if answer is None else str(answer), info, env_id))
    if not tasks:
        raise DataError(source, None, "no rows")
    return tasks


def load_texts(path: str | os.PathLike[str]) -> list[str]:
    """Question texts of a reference file (rows with info.question, question, problem,
    prompt or text), for near-duplicate removal."""
    source, texts = os.fspath(path), []
    for line, row in read_rows(source):
        info: dict[str, Any] = row["info"] if isinstance(row.get("info"), dict) else {}
        if isinstance(info.get("question"), str):
            texts.append(info["question"])
            continue
        _, text = require_any_field(row, ("question", "problem", "prompt", "text"), source, line)
        texts.append(text)
    return texts
