"""The run ledger: every graded rollout, durably, in SQLite (WAL) inside the run directory.

A rollout and its score are committed before the trainer uses them, so a crash loses at
most the in-flight work and the ledger always explains what a step trained on. One row
per rollout: task, sample index, status, policy version, the conversation, token ids,
policy mask, behaviour logprobs, and the score (value, status, components, flags). Once
a step trains on a row, the row also records that step, the row's advantage and the
completion positions the forking-token mask selected (what the dashboard outlines).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rldojo.types import Rollout, Score, first_policy_turn

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
    entropies TEXT NOT NULL DEFAULT '[]',
    info TEXT NOT NULL DEFAULT '{}',
    round INTEGER NOT NULL DEFAULT 0,
    token_rewards TEXT,
    score_value REAL,
    score_status TEXT NOT NULL,
    components TEXT NOT NULL,
    flags TEXT NOT NULL,
    explanation TEXT NOT NULL,
    provenance TEXT NOT NULL,
    trained INTEGER NOT NULL DEFAULT 0,  -- the step that trained on it (0: none yet)
    advantage REAL,  -- the row's sequence advantage when trained (NULL: not trained)
    selected TEXT  -- JSON: completion positions the mask selected (NULL: not trained)
);
CREATE INDEX IF NOT EXISTS rollouts_step ON rollouts(step);
CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts(task_id, step);
CREATE INDEX IF NOT EXISTS rollouts_filter
    ON rollouts(env, status, score_status, score_value, step, trained);
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
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(rollouts)")}
        for name, kind in (("advantage", "REAL"), ("selected", "TEXT")):
            if name not in columns:  # a ledger written before these columns existed
                self._db.execute(f"ALTER TABLE rollouts ADD COLUMN {name} {kind}")
        self._db.commit()

    def add(
        self, step: int, rollouts: Sequence[Rollout], scores: Sequence[Score], *, round: int = 0
    ) -> list[int]:
        """Commit graded rollouts of one collection round of `step` (one transaction)."""
        ids: list[int] = []
        with self._db:
            for r, s in zip(rollouts, scores, strict=True):
                cur = self._db.execute(
                    "INSERT INTO rollouts (step, task_id, env, sample_index, seed, policy_version,"
                    " status, error, messages, completion, prompt_ids, completion_ids,"
                    " policy_mask, logprobs, score_value, score_status, components, flags,"
                    " explanation, provenance, entropies, info, round, token_rewards)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
                        json.dumps(r.entropies),
                        json.dumps(dict(r.info), default=str),
                        round,
                        None if s.token_rewards is None else json.dumps(s.token_rewards),
                    ),
                )
                ids.append(int(cur.lastrowid or 0))
        return ids

    def mark_trained(
        self,
        ids: Sequence[int],
        step: int,
        selection: dict[int, tuple[float, list[int]]] | None = None,
    ) -> None:
        """Record that optimizer step `step` (1-based) trained on these rows; `selection`
        maps a row id to its advantage and the completion positions the mask selected."""
        selection = selection or {}
        rows = []
        for i in ids:
            adv, positions = selection.get(i, (None, None))
            rows.append((step, adv, None if positions is None else json.dumps(positions), i))
        with self._db:
            self._db.executemany(
                "UPDATE rollouts SET trained = ?, advantage = ?, selected = ? WHERE id = ?", rows
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
            query += " WHERE trained > 0" if trained else " WHERE trained = 0"
        return int(self._db.execute(query).fetchone()[0])

    def find_round(self, step: int | None, round: int) -> list[tuple[int, Rollout, Score]]:
        """The graded rollouts of one committed round, to reuse after a crash (in order).
        `step` None: the round id alone names it (the async producer's rounds)."""
        where, args = (
            ("round = ?", (round,)) if step is None else ("step = ? AND round = ?", (step, round))
        )
        rows = self._db.execute(
            f"SELECT id, {_COLUMNS} FROM rollouts WHERE {where} ORDER BY id", args
        ).fetchall()
        return [(int(row[0]), *_decode(row[1:])) for row in rows]

    def rollback(self, step: int) -> None:
        """Resuming from the checkpoint after `step` steps: later training never happened."""
        with self._db:
            self._db.execute(
                "UPDATE rollouts SET trained = 0, advantage = NULL, selected = NULL"
                " WHERE trained > ?",
                (step,),
            )
            self._db.execute("DELETE FROM steps WHERE step > ?", (step,))

    def samples(self, step: int, limit: int = 4) -> list[dict[str, Any]]:
        """A few graded rollouts of `step`, for reading."""
        rows = self._db.execute(
            "SELECT task_id, messages, completion, score_value, score_status, components"
            " FROM rollouts WHERE step = ? ORDER BY id LIMIT ?",
            (step, limit),
        )
        out = []
        for task_id, messages, completion, value, status, components in rows:
            conversation = json.loads(messages)
            first = first_policy_turn(conversation)
            out.append(
                {
                    "task_id": task_id,
                    "prompt": conversation[:first],
                    "completion": completion,
                    "reward": value,
                    "components": json.loads(components),
                    "status": status,
                }
            )
        return out

    def step_metrics(self) -> list[dict[str, Any]]:
        """Metrics of every finished step, in order."""
        rows = self._db.execute("SELECT step, metrics FROM steps ORDER BY step")
        return [{"step": step, **json.loads(m)} for step, m in rows]

    def export_parquet(self, path: str | Path) -> int:
        """Write every rollout row (JSON columns kept as text) to Parquet; returns the count."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        cursor = self._db.execute("SELECT * FROM rollouts ORDER BY id")
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
        table = pa.table({name: [row[i] for row in rows] for i, name in enumerate(names)})
        pq.write_table(table, str(path))
        return len(rows)

    def close(self) -> None:
        self._db.close()


_COLUMNS = (
    "task_id, env, messages, completion, prompt_ids, completion_ids, policy_mask, logprobs,"
    " entropies, policy_version, status, sample_index, seed, error, info, score_value,"
    " score_status, components, flags, token_rewards, explanation, provenance"
)


def _decode(row: Sequence[Any]) -> tuple[Rollout, Score]:
    (
        task_id,
        env,
        messages,
        completion,
        prompt_ids,
        completion_ids,
        mask,
        logprobs,
        entropies,
        version,
        status,
        sample_index,
        seed,
        error,
        info,
        value,
        score_status,
        components,
        flags,
        token_rewards,
        explanation,
        provenance,
    ) = row
    rollout = Rollout(
        task_id=task_id,
        env=env,
        messages=json.loads(messages),
        completion=completion,
        prompt_ids=tuple(json.loads(prompt_ids)),
        completion_ids=tuple(json.loads(completion_ids)),
        policy_mask=tuple(bool(m) for m in json.loads(mask)),
        logprobs=tuple(json.loads(logprobs)),
        entropies=tuple(json.loads(entropies)),
        policy_version=version,
        status=status,
        sample_index=sample_index,
        seed=seed,
        error=error,
        info=json.loads(info),
    )
    score = Score(
        value=value,
        status=score_status,
        components=json.loads(components),
        flags=tuple(json.loads(flags)),
        token_rewards=None if token_rewards is None else tuple(json.loads(token_rewards)),
        explanation=explanation,
        provenance=json.loads(provenance),
    )
    return rollout, score
