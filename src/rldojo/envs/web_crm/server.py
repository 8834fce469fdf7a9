"""The loopback server of web-crm-v1: one uvicorn server per process, many episodes.

`shared_server()` is the process's `WebCrmServer` (made once, thread-safe); it starts
uvicorn on ``127.0.0.1`` and a free port in a daemon thread the first time an episode
opens (`rldojo.asgi.start_in_thread`). Each episode opens a `Session` on its database
connection: a random token, the origin to browse (``http://127.0.0.1:PORT``) and the
cookie that routes the browser's requests to that connection (``rldojo_episode=<token>``).
Requests without a live token get a 403 page; `close_session` ends one.

The connection belongs to the environment, which works on it from its own thread:
`Session.lock` is the lock every request holds while it touches the database, and the
environment holds it too around its own use (a diff, a snapshot, a reset) — never while
it waits for the browser, whose requests would wait for it.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from dataclasses import dataclass

import uvicorn

from rldojo.asgi import start_in_thread
from rldojo.envs.web_crm.app import create_app
from rldojo.envs.web_crm.episode import COOKIE, Episode

__all__ = ["COOKIE", "Session", "WebCrmServer", "shared_server"]

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Session:
    """One episode's access to the server: its token, the origin to open pages on, and
    the episode the app serves (connection, lock, request count)."""

    token: str
    origin: str
    episode: Episode

    @property
    def conn(self) -> sqlite3.Connection:
        """The episode's database connection."""
        return self.episode.conn

    @property
    def lock(self) -> threading.Lock:
        """Held by every request while it uses the connection; hold it to use it too."""
        return self.episode.lock

    @property
    def requests(self) -> int:
        """HTTP requests this session has received so far."""
        return self.episode.requests

    @property
    def cookie(self) -> dict[str, str]:
        """The cookie to set, in the form of Playwright's ``BrowserContext.add_cookies``."""
        return {"name": COOKIE, "value": self.token, "url": self.origin}

    def url(self, path: str = "/") -> str:
        """An absolute URL on the server, e.g. ``session.url("/deals")``."""
        return self.origin + path


class WebCrmServer:
    """The web application served on a loopback port to every open `Session`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._app = create_app(self._episode)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._origin: str | None = None

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``; starts the server on first use."""
        with self._lock:
            if self._origin is None:
                self._server, self._thread, port = start_in_thread(
                    self._app, HOST, 0, name="rldojo-web-crm"
                )
                self._origin = f"http://{HOST}:{port}"
            return self._origin

    def open_session(self, conn: sqlite3.Connection) -> Session:
        """Serve `conn` to requests that carry the new session's cookie."""
        session = Session(secrets.token_urlsafe(16), self.origin, Episode(conn))
        with self._lock:
            self._sessions[session.token] = session
        return session

    def close_session(self, token: str) -> None:
        """Stop serving a session (its cookie gets 403 from now on); unknown: no-op."""
        with self._lock:
            self._sessions.pop(token, None)

    def session(self, token: str) -> Session | None:
        """The open session of `token`, if any."""
        with self._lock:
            return self._sessions.get(token)

    def _episode(self, token: str) -> Episode | None:
        session = self.session(token)
        return None if session is None else session.episode

    def close(self) -> None:
        """Stop the server and forget every session (tests; the shared one lives on)."""
        with self._lock:
            self._sessions.clear()
            server, thread = self._server, self._thread
            self._server = self._thread = self._origin = None
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(timeout=10)


_SHARED: WebCrmServer | None = None
_SHARED_LOCK = threading.Lock()


def shared_server() -> WebCrmServer:
    """The process's server, made on first call (it starts when a session opens)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = WebCrmServer()
        return _SHARED
