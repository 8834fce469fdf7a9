"""The service's durable state: files, jobs, events and checkpoints in one SQLite file.

`ServiceState(data_dir)` opens `DATA/service.sqlite` (WAL, `synchronous=FULL`): every
write commits before the HTTP reply that acknowledges it, so a `kill -9` of the service
loses nothing it has answered. One connection, shared by the API's threads under a lock
(SQLite serialises writers anyway; the service writes little and reads by primary key).

Rows are plain dicts; the JSON columns (`metadata`, `method`, `hyperparameters`, `error`,
`data`, `metrics`) are decoded on the way out. Every row carries its `owner` (a hash of
the API key, never the key), and every lookup takes the owner: another key's object is
simply not found.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["JOB_STATUSES", "TERMINAL", "ServiceState", "new_id"]

JOB_STATUSES = (
    "validating_files",
    "queued",
    "running",
    "paused",
    "succeeded",
    "failed",
    "cancelled",
)
"""OpenAI's job statuses; `paused` is the state `POST .../pause` leaves a job in."""

TERMINAL = ("succeeded", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, owner TEXT, filename TEXT,
    bytes INTEGER, purpose TEXT, created_at INTEGER, path TEXT, deleted INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, owner TEXT, model TEXT,
    training_file TEXT, validation_file TEXT, suffix TEXT, seed INTEGER, metadata TEXT,
    method TEXT, hyperparameters TEXT, status TEXT, created_at INTEGER,
    finished_at INTEGER, error TEXT, fine_tuned_model TEXT, trained_tokens INTEGER,
    run_dir TEXT, attempts INTEGER DEFAULT 0, steps INTEGER, result_files TEXT);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, job_id TEXT, created_at INTEGER,
    level TEXT, message TEXT, type TEXT, data TEXT);
CREATE TABLE IF NOT EXISTS checkpoints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, job_id TEXT, owner TEXT,
    step INTEGER, metrics TEXT, path TEXT, model TEXT, created_at INTEGER,
    UNIQUE (job_id, step));
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, seq);
"""

_JSON_COLUMNS = (
    "metadata",
    "method",
    "hyperparameters",
    "error",
    "data",
    "metrics",
    "result_files",
)


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `file-…`, `ftjob-…`, `ftevent-…`, `ftckpt-…`."""
    return f"{prefix}-{secrets.token_hex(12)}"


def _row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> dict[str, Any]:
    row = {d[0]: v for d, v in zip(cursor.description, values, strict=True)}
    for key in _JSON_COLUMNS:
        if key in row and isinstance(row[key], str):
            row[key] = json.loads(row[key])
    return row


class ServiceState:
    """Files, jobs, events and checkpoints of one data directory (module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            data_dir / "service.sqlite", check_same_thread=False, isolation_level=None
        )
        self._db.row_factory = _row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            columns = {r["name"] for r in self._db.execute("PRAGMA table_info(jobs)").fetchall()}
            if "result_files" not in columns:  # a data dir from before result files
                self._db.execute("ALTER TABLE jobs ADD COLUMN result_files TEXT")

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def _insert(self, table: str, row: dict[str, Any]) -> None:
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        values = tuple(json.dumps(v) if k in _JSON_COLUMNS else v for k, v in row.items())
        self._exec(f"INSERT INTO {table} ({cols}) VALUES ({marks})", values)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---------------------------------------------------------------- files

    def add_file(self, row: dict[str, Any]) -> None:
        self._insert("files", row)

    def file(self, owner: str, file_id: str) -> dict[str, Any] | None:
        rows = self._exec(
            "SELECT * FROM files WHERE id=? AND owner=? AND deleted=0", (file_id, owner)
        )
        return rows[0] if rows else None

    def files(self, owner: str) -> list[dict[str, Any]]:
        return self._exec(
            "SELECT * FROM files WHERE owner=? AND deleted=0 ORDER BY seq DESC", (owner,)
        )

    def delete_file(self, owner: str, file_id: str) -> bool:
        with self._lock:
            cur = self._db.execute(
                "UPDATE files SET deleted=1 WHERE id=? AND owner=? AND deleted=0", (file_id, owner)
            )
            return cur.rowcount == 1

    # ---------------------------------------------------------------- jobs

    def add_job(self, row: dict[str, Any]) -> None:
        self._insert("jobs", row)

    def job(self, owner: str | None, job_id: str) -> dict[str, Any] | None:
        """The job, or None; `owner=None` is the scheduler's view (any owner)."""
        if owner is None:
            rows = self._exec("SELECT * FROM jobs WHERE id=?", (job_id,))
        else:
            rows = self._exec("SELECT * FROM jobs WHERE id=? AND owner=?", (job_id, owner))
        return rows[0] if rows else None

    def jobs(self, owner: str) -> list[dict[str, Any]]:
        return self._exec("SELECT * FROM jobs WHERE owner=? ORDER BY seq DESC", (owner,))

    def jobs_in(self, *statuses: str) -> list[dict[str, Any]]:
        """Jobs in these statuses, oldest first (the queue order)."""
        marks = ", ".join("?" for _ in statuses)
        return self._exec(f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY seq", statuses)

    def update_job(self, job_id: str, *, only_from: tuple[str, ...] = (), **fields: object) -> bool:
        """Set fields; with `only_from`, only while the status is one of those (atomic:
        a cancel and a finishing worker cannot both win). True if the row changed."""
        sets = ", ".join(f"{k}=?" for k in fields)
        values = [json.dumps(v) if k in _JSON_COLUMNS else v for k, v in fields.items()]
        sql = f"UPDATE jobs SET {sets} WHERE id=?"
        args: list[Any] = [*values, job_id]
        if only_from:
            sql += f" AND status IN ({', '.join('?' for _ in only_from)})"
            args += list(only_from)
        with self._lock:
            return self._db.execute(sql, tuple(args)).rowcount == 1

    # ---------------------------------------------------------------- events

    def add_event(
        self,
        job_id: str,
        message: str,
        *,
        level: str = "info",
        kind: str = "message",
        data: dict[str, Any] | None = None,
    ) -> None:
        self._insert(
            "events",
            {
                "id": new_id("ftevent"),
                "job_id": job_id,
                "created_at": int(time.time()),
                "level": level,
                "message": message,
                "type": kind,
                "data": data or {},
            },
        )

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """A job's events, newest first (OpenAI's order)."""
        return self._exec("SELECT * FROM events WHERE job_id=? ORDER BY seq DESC", (job_id,))

    # ---------------------------------------------------------------- checkpoints

    def add_checkpoint(self, row: dict[str, Any]) -> bool:
        """Record a checkpoint once (a resumed job rediscovers the ones it had)."""
        try:
            self._insert("checkpoints", row)
        except sqlite3.IntegrityError:
            return False
        return True

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        return self._exec("SELECT * FROM checkpoints WHERE job_id=? ORDER BY step DESC", (job_id,))

    def owned_checkpoints(self, owner: str) -> list[dict[str, Any]]:
        return self._exec("SELECT * FROM checkpoints WHERE owner=? ORDER BY seq", (owner,))

    def delete_checkpoints(self, job_id: str, steps: list[int]) -> None:
        """Forget a job's checkpoints at `steps` (their directories were deleted)."""
        marks = ", ".join("?" for _ in steps)
        self._exec(
            f"DELETE FROM checkpoints WHERE job_id=? AND step IN ({marks})", (job_id, *steps)
        )
