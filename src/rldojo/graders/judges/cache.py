"""A persistent cache of judge replies (SQLite), so re-grading the same samples is free.

The key is a SHA-256 over everything that determines a reply:

    judge model  +  prompt template hash  +  the rendered messages (which hold the
    sample, the reference and the rubric)  +  sampling parameters  +  seed

so a changed rubric, template, sample or temperature is a miss, and nothing else is.
Only replies are stored (the raw text); parsing is deterministic and re-done on a hit, so
an unparseable reply that was followed by a repair request costs zero calls again too.
Transport failures are never stored.

The file uses WAL mode and a busy timeout so several processes may share it. The default
location is ``$RLDOJO_CACHE/judge.sqlite`` (``~/.cache/rldojo/judge.sqlite``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["JudgeCache", "cache_key", "default_cache_path"]


def default_cache_path() -> Path:
    from rldojo.cache import cache_dir

    return cache_dir() / "judge.sqlite"


def cache_key(model: str, template_hash: str, payload: Mapping[str, Any]) -> str:
    """SHA-256 of the judge model, template hash and request payload (canonical JSON)."""
    blob = json.dumps(
        {"model": model, "template": template_hash, "request": payload},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class JudgeCache:
    """Judge replies by key. Thread-safe; one connection per cache object."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS judge_replies ("
            " key TEXT PRIMARY KEY, model TEXT NOT NULL, template_hash TEXT NOT NULL,"
            " reply TEXT NOT NULL, created REAL NOT NULL, meta TEXT NOT NULL)"
        )
        self._db.commit()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT reply FROM judge_replies WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return str(row[0])

    def put(
        self, key: str, reply: str, *, model: str, template_hash: str, meta: Mapping[str, Any]
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO judge_replies VALUES (?, ?, ?, ?, ?, ?)",
                (key, model, template_hash, reply, time.time(), json.dumps(dict(meta))),
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM judge_replies").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
