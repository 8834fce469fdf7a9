"""The run ledger: every graded rollout, durably, in SQLite (WAL) inside the run directory.

A rollout and its score are committed before the trainer uses them, so a crash loses at
most the in-flight work and the ledger always explains what a step trained on. One row
per rollout: task, sample index, status, policy version, the conversation, token ids,
policy mask, behaviour logprobs, and the score (value, status, components, flags).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rldojo.types import Rollout, Score

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    env TEXT NOT NULL,
    sample_index INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT NOT NULL,
    messages TEXT NOT NULL,
    completion TEXT NOT NULL,
    prompt_ids TEXT NOT NULL,
    completion_ids TEXT NOT NULL,
    policy_mask TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    score_value REAL,
    score_status TEXT NOT NULL,
    components TEXT NOT NULL,
    flags TEXT NOT NULL,
    explanation TEXT NOT NULL,
    provenance TEXT NOT NULL,
    trained INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rollouts_step ON rollouts(step);
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY,
    metrics TEXT NOT NULL
);
"""


class Ledger:
    """Append-only store of graded rollouts and step metrics for one run."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.commit()

    def add(self, step: int, rollouts: Sequence[Rollout], scores: Sequence[Score]) -> list[int]:
        """Commit graded rollouts for `step`; returns their row ids."""
        ids: list[int] = []
        with self._db:
            for r, s in zip(rollouts, scores, strict=True):
                cur = self._db.execute(
                    "INSERT INTO rollouts (step, task_id, env, sample_index, seed, policy_version,"
                    " status, error, messages, completion, prompt_ids, completion_ids,"
                    " policy_mask, logprobs, score_value, score_status, components, flags,"
                    " explanation, provenance) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        step,
                        r.task_id,
                        r.env,
                        r.sample_index,
                        r.seed,
                        r.policy_version,
                        r.status,
                        r.error,
                        json.dumps(r.messages),
                        r.completion,
                        json.dumps(r.prompt_ids),
                        json.dumps(r.completion_ids),
                        json.dumps([int(m) for m in r.policy_mask]),
                        json.dumps(r.logprobs),
                        s.value,
                        s.status,
                        json.dumps(dict(s.components)),
                        json.dumps(s.flags),
                        s.explanation,
                        json.dumps(dict(s.provenance), default=str),
                    ),
                )
                ids.append(int(cur.lastrowid or 0))
        return ids

    def mark_trained(self, ids: Sequence[int]) -> None:
        with self._db:
            self._db.executemany(
                "UPDATE rollouts SET trained = 1 WHERE id = ?", [(i,) for i in ids]
            )

    def add_step(self, step: int, metrics: dict[str, Any]) -> None:
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO steps (step, metrics) VALUES (?, ?)",
                (step, json.dumps(metrics, default=float)),
            )

    def status_counts(self) -> dict[str, int]:
        """Rollouts by `rollout_status/score_status`, e.g. `{"ok/ok": 60, "ok/timeout": 4}`."""
        rows = self._db.execute(
            "SELECT status, score_status, COUNT(*) FROM rollouts GROUP BY status, score_status"
        )
        return {f"{a}/{b}": int(n) for a, b, n in rows}

    def count(self, *, trained: bool | None = None) -> int:
        query = "SELECT COUNT(*) FROM rollouts"
        if trained is not None:
            query += f" WHERE trained = {int(trained)}"
        return int(self._db.execute(query).fetchone()[0])

    def samples(self, step: int, limit: int = 4) -> list[dict[str, Any]]:
        """A few graded rollouts of `step`, for reading."""
        rows = self._db.execute(
            "SELECT task_id, completion, score_value, score_status FROM rollouts"
            " WHERE step = ? ORDER BY id LIMIT ?",
            (step, limit),
        )
        return [{"task_id": t, "completion": c, "reward": v, "status": st} for t, c, v, st in rows]

    def step_metrics(self) -> list[dict[str, Any]]:
        """Metrics of every finished step, in order."""
        rows = self._db.execute("SELECT metrics FROM steps ORDER BY step")
        return [json.loads(m) for (m,) in rows]

    def close(self) -> None:
        self._db.close()
