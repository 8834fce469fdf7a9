"""One episode's database as the web application sees it, and how a request finds it.

Many episodes share one application (`rldojo.envs.web_crm.server`): each request carries
the cookie ``rldojo_episode=<token>`` and `current_episode` looks the token up in the
application's ``state.episodes`` (a callable, token -> `Episode` or None). A request
without a known token is refused with a 403 page (`NoEpisode`).

The episode's connection is shared with the environment, which runs in another thread:
every handler works on it under `Episode.lock`, and the environment takes the same lock
around its own reads (never across a browser action, or the page would wait forever).
`rows` and `record` are the handlers' reads (SQL straight to the connection; writes go
through `CrmApi`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse

from rldojo.envs.web_crm.pages import layout

__all__ = [
    "COOKIE",
    "Episode",
    "EpisodeLookup",
    "NoEpisode",
    "NotFound",
    "Row",
    "current_episode",
    "record",
    "rows",
]

COOKIE = "rldojo_episode"
"""The cookie whose value is the episode's token."""


@dataclass
class Episode:
    """One episode's CRM database, the lock around it, the number of requests it got and
    the flash message the next page shows (set by a write that redirects)."""

    conn: sqlite3.Connection
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    flash: str | None = None

    def page(self, title: str, body: str, status: int = 200) -> HTMLResponse:
        """A page, with the pending flash message (shown once)."""
        flash, self.flash = self.flash, None
        return HTMLResponse(layout(title, body, flash), status_code=status)

    def form_page(self, title: str, body: str, error: str | None) -> HTMLResponse:
        """A form's page: 422 when it comes back with the alert `error` (the page still
        renders, values kept), else 200."""
        return self.page(title, body, 422 if error else 200)

    def redirect(self, url: str, message: str) -> RedirectResponse:
        """303 See Other to `url`, whose page will show `message`."""
        self.flash = message
        return RedirectResponse(url, status_code=303)


Row = dict[str, Any]
"""A database row by column name."""

EpisodeLookup = Callable[[str], Episode | None]
"""Token -> its episode, or None when the token is unknown."""


class NoEpisode(Exception):
    """The request carries no cookie of a live episode (answered with a 403 page)."""


class NotFound(Exception):
    """A record or page that does not exist (answered with a 404 page)."""


def current_episode(request: Request) -> Episode:
    """The episode of the request's cookie (counted as one more request of it)."""
    lookup: EpisodeLookup = request.app.state.episodes
    episode = lookup(request.cookies.get(COOKIE, ""))
    if episode is None:
        raise NoEpisode
    with episode.lock:
        episode.requests += 1
    return episode


def rows(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
    """The rows of a query as dicts."""
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def record(conn: sqlite3.Connection, table: str, row_id: str, kind: str) -> Row:
    """One row by id; `NotFound` (a 404 page) when there is none."""
    found = rows(conn, f"SELECT * FROM {table} WHERE id = ?", (row_id,))
    if not found:
        raise NotFound(f"{kind} {row_id} not found.")
    return found[0]
