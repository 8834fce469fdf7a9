"""Which Chromium web-crm-v1 drives, found before any episode, and what to do when there
is none.

In order: the path named by the env's kwargs (`chromium_path`), else by the environment
variable `RLDOJO_CHROMIUM`; else Playwright's own browser (`playwright install chromium`
puts it where Playwright's driver says); else a system `chromium`, `chromium-browser` or
`google-chrome` on the PATH. A named path that is not an executable file, or no browser
at all, is an `EnvUnavailableError`: the machine lacks a browser, the config is fine.

Asking Playwright's driver where its browser lives starts a Node process (~0.4 s), so the
answer is kept per process (and per `PLAYWRIGHT_BROWSERS_PATH`, which moves it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rldojo.envs.base import EnvUnavailableError

__all__ = ["CHROMIUM_ENV", "Chromium", "find_chromium", "playwright_chromium"]

CHROMIUM_ENV = "RLDOJO_CHROMIUM"
"""The environment variable naming the Chromium binary (below the `chromium_path` kwarg)."""

SYSTEM_NAMES = ("chromium", "chromium-browser", "google-chrome")
"""A system browser's command names (Debian, Ubuntu, Google's package), looked up on PATH."""

HOW_TO_GET_ONE = (
    "apt-get install chromium (or your distribution's package), or pip install playwright "
    "&& playwright install chromium; or name a binary with env.kwargs.chromium_path or "
    + CHROMIUM_ENV
)


@dataclass(frozen=True)
class Chromium:
    """A browser binary and where it was found."""

    path: str
    """The executable's path."""
    source: str
    """What named it: "env.kwargs.chromium_path", "RLDOJO_CHROMIUM", "Playwright" or "PATH"."""


def find_chromium(
    chromium_path: str | None = None,
    *,
    playwright_path: Callable[[], str | None] | None = None,
) -> Chromium:
    """The Chromium to launch (the order: the module docstring); `EnvUnavailableError` when
    a named one is not an executable file or none is found. `playwright_path` answers where
    Playwright keeps its browser (default: `playwright_chromium`, asked only when no path
    is named; the browser pool passes its own running Playwright's answer)."""
    for path, source in (
        (chromium_path, "env.kwargs.chromium_path"),
        (os.environ.get(CHROMIUM_ENV), CHROMIUM_ENV),
    ):
        if path:
            found = shutil.which(os.path.expanduser(path))
            if found is None:
                raise EnvUnavailableError(
                    f"{source} = {path!r} is not an executable file; "
                    f"to get a Chromium: {HOW_TO_GET_ONE}"
                )
            return Chromium(found, source)
    own = (playwright_path or playwright_chromium)()
    if own and shutil.which(own):
        return Chromium(own, "Playwright")
    for name in SYSTEM_NAMES:
        found = shutil.which(name)
        if found:
            return Chromium(found, "PATH")
    raise EnvUnavailableError(f"no Chromium found: {HOW_TO_GET_ONE}")


_ANSWERS: dict[str | None, str | None] = {}
_ANSWERS_LOCK = threading.Lock()


def playwright_chromium() -> str | None:
    """Where Playwright keeps its Chromium (the file may not be there: not installed yet);
    None without Playwright. Asked once per process and `PLAYWRIGHT_BROWSERS_PATH`."""
    key = os.environ.get("PLAYWRIGHT_BROWSERS_PATH")
    with _ANSWERS_LOCK:
        if key not in _ANSWERS:
            _ANSWERS[key] = _ask_playwright()
        return _ANSWERS[key]


def _ask_playwright() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return None
    # Playwright's sync API refuses a thread whose event loop runs (an env made inside a
    # coroutine): ask from a thread of its own.
    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(_executable_path).result()


def _executable_path() -> str | None:
    from playwright.sync_api import Error, sync_playwright

    try:
        with sync_playwright() as p:
            return str(p.chromium.executable_path)
    except Error:  # a driver that cannot start: Playwright's browser cannot either
        return None
