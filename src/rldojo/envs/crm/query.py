"""Two generic tools over an environment's own data: read-only SQL and BM25 search.

`sql_tool(conn)` runs one SELECT on the environment's SQLite connection. Read-only is
enforced by SQLite itself, not by parsing: an authorizer allows only reads, selects and
functions (no writes, ATTACH, PRAGMA or hidden ``_tables``), a progress handler stops
queries that run too long, values are capped in size and results in rows.

`search_tool(documents)` ranks a local document collection with BM25 (rank-bm25) and
returns the best matches. crm-v1 uses both (its knowledge base and its database); any
tool environment can mount them.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rank_bm25 import BM25Okapi

from rldojo.envs.tools import Tool, ToolError

__all__ = ["search_tool", "sql_tool"]

_WORD = re.compile(r"[a-z0-9]+")
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_ALLOWED.add(getattr(sqlite3, "SQLITE_RECURSIVE", 33))


def _schema_line(conn: sqlite3.Connection, hidden: str) -> str:
    tables = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid"
    ).fetchall()
    parts = []
    for (name,) in tables:
        if name.startswith(hidden) or name.startswith("sqlite_"):
            continue
        cols = [row[1] for row in conn.execute(f"PRAGMA table_info({name})")]
        parts.append(f"{name}({', '.join(cols)})")
    return "; ".join(parts)


def sql_tool(
    conn: sqlite3.Connection,
    *,
    name: str = "sql",
    hidden_prefix: str = "_",
    max_rows: int = 50,
    time_limit_s: float = 0.5,
    max_value_bytes: int = 1_000_000,
) -> Tool:
    """A tool that runs one read-only SQL query on `conn` (see the module docstring)."""

    def authorize(
        action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None
    ) -> int:
        if action not in _ALLOWED:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_READ and str(arg1).startswith(hidden_prefix):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def run(query: str) -> dict[str, Any]:
        """Run one read-only SQL SELECT statement and return columns and rows."""
        deadline = time.perf_counter() + time_limit_s
        conn.set_authorizer(authorize)
        conn.set_progress_handler(lambda: int(time.perf_counter() > deadline), 10_000)
        length = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)  # zeroblob(1e9)
        try:
            cursor = conn.execute(query)
            rows = cursor.fetchmany(max_rows + 1)
            columns = [d[0] for d in cursor.description or ()]
        except sqlite3.Warning as exc:  # e.g. more than one statement
            raise ToolError(f"SQL error: {exc}") from None
        except sqlite3.Error as exc:
            why = "query took too long" if "interrupted" in str(exc) else str(exc)
            if "not authorized" in why:
                why += " (read-only: SELECT on the listed tables only)"
            raise ToolError(f"SQL error: {why}") from None
        finally:
            conn.set_authorizer(None)
            conn.set_progress_handler(None, 0)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)
        return {
            "columns": columns,
            "rows": [list(r) for r in rows[:max_rows]],
            "truncated": len(rows) > max_rows,
        }

    description = (
        f"Run one read-only SQL SELECT (SQLite) and get at most {max_rows} rows. "
        f"Tables: {_schema_line(conn, hidden_prefix)}"
    )
    return Tool.from_function(run, name=name, description=description)


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def search_tool(
    documents: Sequence[Mapping[str, str]],
    *,
    name: str = "search",
    description: str = "Search the document collection; returns the best matching documents.",
) -> Tool:
    """A BM25 search tool over `documents` (each with ``id``, ``title``, ``text``)."""
    docs = [dict(d) for d in documents]
    if not docs:
        raise ValueError("search_tool needs at least one document")
    index = BM25Okapi([_tokens(f"{d.get('title', '')} {d['text']}") for d in docs])

    def run(query: str, limit: int = 3) -> list[dict[str, str]]:
        """Search the documents.

        Args:
            query: words to look for.
            limit: how many documents to return (1-10).
        """
        if not 1 <= limit <= 10:
            raise ToolError("limit must be between 1 and 10")
        words = _tokens(query)
        if not words:
            raise ToolError("query must contain at least one word")
        scores = index.get_scores(words)
        ranked = sorted(range(len(docs)), key=lambda i: (-scores[i], i))
        return [docs[i] for i in ranked[:limit] if scores[i] > 0]

    return Tool.from_function(run, name=name, description=description)
