"""The ledger as the rollout viewer reads it: server-side pages and filters, one rollout
with its tokens, one group side by side.

The ledger (`rldojo.store.ledger`) is opened read-only (`mode=ro`), so the dashboard
never writes to a run that is training and never creates a ledger that is missing. A
page selects only light columns (no token lists), so a page of 50 rows from a ledger of
100,000 rollouts reads a few kilobytes; filters are SQL `WHERE` clauses with bound
parameters.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_PAGE = 200
"""The largest page a request may ask for."""

PREVIEW_CHARS = 160
"""Characters of the completion shown in a page row."""

STEP_OFFSET = 1
"""The ledger's `step` is the trainer's step counter when the rollouts were collected
(0 for the first step); the viewer shows and filters by `step + 1`, the step whose
metrics line (and update) they belong to, as the charts and `trained` count."""


class LedgerMissing(LookupError):
    """The run has no (readable) ledger yet."""


@dataclass
class Filters:
    """Rollout filters; each None/empty one is not applied.

    step: rollouts of this step. env: of this environment id. task: task ids containing
    this text. status: rollout status or score status equal to it (`ok`, `timeout`,
    `crashed`, ...). score_min / score_max: score value within the bounds (unscored rows
    are excluded once either is set). text: conversation text containing it
    (case-insensitive for ASCII). trained: only rows an optimizer step trained on.
    """

    step: int | None = None
    env: str | None = None
    task: str | None = None
    status: str | None = None
    score_min: float | None = None
    score_max: float | None = None
    text: str | None = None
    trained: bool = False

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if self.step is not None:
            clauses.append("step = ?")
            args.append(self.step - STEP_OFFSET)
        if self.env:
            clauses.append("env = ?")
            args.append(self.env)
        if self.task:
            clauses.append("task_id LIKE ? ESCAPE '\\'")
            args.append(f"%{_escape(self.task)}%")
        if self.status:
            clauses.append("(status = ? OR score_status = ?)")
            args += [self.status, self.status]
        if self.score_min is not None:
            clauses.append("score_value >= ?")
            args.append(self.score_min)
        if self.score_max is not None:
            clauses.append("score_value <= ?")
            args.append(self.score_max)
        if self.text:
            clauses.append("messages LIKE ? ESCAPE '\\'")
            args.append(f"%{_escape(json.dumps(self.text)[1:-1])}%")
        if self.trained:
            clauses.append("trained > 0")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _has_column(db: sqlite3.Connection, name: str) -> bool:
    return any(row[1] == name for row in db.execute("PRAGMA table_info(rollouts)"))


class LedgerView:
    """Read-only queries over one run's `ledger.sqlite`."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise LedgerMissing(f"{path.parent.name} has no ledger.sqlite yet")
        try:
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
            self._db.execute("SELECT 1 FROM rollouts LIMIT 1")
        except sqlite3.Error as exc:
            raise LedgerMissing(f"{path.parent.name}/ledger.sqlite is not readable: {exc}") from exc
        self._selected = _has_column(self._db, "selected")

    def close(self) -> None:
        self._db.close()

    def facets(self) -> dict[str, Any]:
        """What the filters can take: step range, env ids, statuses, total rows."""
        db = self._db
        lo, hi, total = db.execute(
            f"SELECT MIN(step) + {STEP_OFFSET}, MAX(step) + {STEP_OFFSET}, COUNT(*) FROM rollouts"
        ).fetchone()
        envs = [e for (e,) in db.execute("SELECT DISTINCT env FROM rollouts ORDER BY env")]
        statuses = sorted(
            {s for (s,) in db.execute("SELECT DISTINCT status FROM rollouts")}
            | {s for (s,) in db.execute("SELECT DISTINCT score_status FROM rollouts")}
        )
        return {"steps": [lo, hi], "envs": envs, "statuses": statuses, "total": total}

    def page(self, filters: Filters, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """One page of rollouts (newest first, in ledger order) and the count of
        all rows the filters match."""
        limit = max(1, min(int(limit), MAX_PAGE))
        offset = max(0, int(offset))
        where, args = filters.where()
        adv = "advantage" if self._selected else "NULL"
        rows = self._db.execute(
            f"SELECT id, step + {STEP_OFFSET}, env, task_id, sample_index, status, score_status,"
            " score_value,"
            f" trained, {adv}, substr(completion, 1, {PREVIEW_CHARS}), length(completion)"
            f" FROM rollouts{where} ORDER BY step DESC, id DESC LIMIT ? OFFSET ?",
            [*args, limit, offset],
        ).fetchall()
        total = self._db.execute(f"SELECT COUNT(*) FROM rollouts{where}", args).fetchone()[0]
        keys = (
            "id",
            "step",
            "env",
            "task_id",
            "sample_index",
            "status",
            "score_status",
            "score",
            "trained",
            "advantage",
            "preview",
            "chars",
        )
        return {
            "rows": [dict(zip(keys, row, strict=True)) for row in rows],
            "total": total,
            "offset": offset,
            "limit": limit,
        }

    def rollout(self, row_id: int) -> dict[str, Any] | None:
        """One rollout whole: conversation, tokens with logprob/entropy/mask, score."""
        extra = "advantage, selected" if self._selected else "NULL, NULL"
        row = self._db.execute(
            f"SELECT id, step + {STEP_OFFSET}, env, task_id, sample_index, seed, policy_version,"
            " status, error,"
            " messages, completion, completion_ids, policy_mask, logprobs, entropies, info,"
            " score_value, score_status, components, flags, explanation, trained,"
            f" {extra} FROM rollouts WHERE id = ?",
            (row_id,),
        ).fetchone()
        if row is None:
            return None
        (
            rid,
            step,
            env,
            task_id,
            sample,
            seed,
            version,
            status,
            error,
            messages,
            completion,
            ids,
            mask,
            logprobs,
            entropies,
            info,
            value,
            score_status,
            components,
            flags,
            explanation,
            trained,
            advantage,
            selected,
        ) = row
        return {
            "id": rid,
            "step": step,
            "env": env,
            "task_id": task_id,
            "sample_index": sample,
            "seed": seed,
            "policy_version": version,
            "status": status,
            "error": error,
            "messages": json.loads(messages),
            "completion": completion,
            "completion_ids": json.loads(ids),
            "policy_mask": json.loads(mask),
            "logprobs": json.loads(logprobs),
            "entropies": json.loads(entropies),
            "info": json.loads(info),
            "score": value,
            "score_status": score_status,
            "components": json.loads(components),
            "flags": json.loads(flags),
            "explanation": explanation,
            "trained": trained,
            "advantage": advantage,
            "selected": None if selected is None else json.loads(selected),
        }

    def group(self, step: int, task_id: str) -> list[dict[str, Any]]:
        """The G samples of one task at one step, in sample order, with their rewards."""
        adv = "advantage" if self._selected else "NULL"
        rows = self._db.execute(
            f"SELECT id, sample_index, status, score_status, score_value, {adv}, trained,"
            " completion FROM rollouts WHERE step = ? AND task_id = ? ORDER BY sample_index, id",
            (step - STEP_OFFSET, task_id),
        ).fetchall()
        keys = (
            "id",
            "sample_index",
            "status",
            "score_status",
            "score",
            "advantage",
            "trained",
            "completion",
        )
        return [dict(zip(keys, r, strict=True)) for r in rows]
