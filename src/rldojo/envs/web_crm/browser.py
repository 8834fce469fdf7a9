"""The browser of web-crm-v1: one headless Chromium shared by the episodes, each episode a
fresh, isolated context with one page that can reach only its application's origin.

Playwright's async objects belong to the event loop that made them, while envs are called
from several loops (the trainer's, `asyncio.run` in checks). So Playwright runs on a
thread of its own with its own loop; every public coroutine hands its work to that loop
(`run_coroutine_threadsafe`) and awaits the answer from whatever loop the caller is on
(the `*_sync` twins block instead).

A dead or hung Chromium is `BrowserCrashed` / `BrowserTimeout` for the call that found
it, and the next `open` launches a new one. What a session may reach, and the actions,
live in `rldojo.envs.web_crm.browser_session`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from rldojo.envs.web_crm.browser_session import (
    ActionError,
    BrowserCrashed,
    BrowserSession,
    BrowserTimeout,
    origin_of,
)

if TYPE_CHECKING:
    from playwright._impl._api_structures import SetCookieParam  # not re-exported
    from playwright.async_api import Browser, BrowserContext, Playwright

__all__ = [
    "ActionError",
    "BrowserCrashed",
    "BrowserPool",
    "BrowserSession",
    "BrowserTimeout",
]

T = TypeVar("T")

LAUNCH_TIMEOUT_S = 60.0
"""Bound on starting Chromium (a cold start on a loaded machine takes a few seconds)."""


class _LoopThread:
    """A daemon thread running one event loop, for Playwright's async objects to live on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rldojo-browser", daemon=True
        )
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the thread's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the thread's loop and await it from the caller's loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the thread's loop and block until it ends."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a *_sync browser call from the browser's own thread would hang")
        return self.submit(coro).result()

    def stop(self) -> None:
        """Stop the loop and wait for the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class BrowserPool:
    """One Chromium process, launched on the first `open`, and at most `max_contexts`
    episodes' contexts at once (`open` waits for a free slot), opened one at a time.

    `action_timeout_s` bounds each action and observation, `executable` is the Chromium
    binary (None: `rldojo.envs.web_crm.chromium.find_chromium` at launch, Playwright's own
    browser asked of the pool's Playwright), `args` its extra switches (`--no-sandbox`
    because the trainer runs as root), `max_lines` the body lines an observation shows.
    """

    def __init__(
        self,
        max_contexts: int = 8,
        action_timeout_s: float = 15.0,
        executable: str | None = None,
        args: Sequence[str] = ("--no-sandbox",),
        max_lines: int = 80,
    ) -> None:
        self.max_contexts = max_contexts
        self.action_timeout_s = action_timeout_s
        self.executable = executable
        self.args = list(args)
        self.max_lines = max_lines
        self._thread = _LoopThread()
        self._slots: asyncio.Semaphore | None = None
        # Contexts open one at a time: 8 episodes' opens asked for together took 7.1 s
        # when they ran together, 3.4 s one by one (2 cores), and each open's timeout
        # then measures its own work, not a queue inside Chromium (48 at once timed
        # out, and the pool killed the browser under the others).
        self._opening = asyncio.Lock()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._pid: int | None = None
        self._closed = False

    @property
    def browser_pid(self) -> int | None:
        """The process id of the running Chromium (its browser process), None before the
        first `open` or after a crash was noticed."""
        return self._pid

    async def open(
        self, origin: str, cookies: Sequence[dict[str, Any]] = (), start_path: str = "/"
    ) -> BrowserSession:
        """A new session on `origin` (`http://host:port`) with `cookies` set (a cookie
        without `url`/`domain` is set for the origin) and its page loaded at `start_path`.
        Raises `BrowserCrashed` / `BrowserTimeout` when no browser could serve it."""
        return await self._thread.run(self._open(origin, cookies, start_path))

    def open_sync(
        self, origin: str, cookies: Sequence[dict[str, Any]] = (), start_path: str = "/"
    ) -> BrowserSession:
        """`open`, blocking (not from inside the browser's own thread)."""
        return self._thread.run_sync(self._open(origin, cookies, start_path))

    def allow(self, max_contexts: int) -> None:
        """Raise the limit on contexts open at once to `max_contexts` (never lowers it)."""
        extra = max_contexts - self.max_contexts
        if extra <= 0:
            return
        self.max_contexts = max_contexts
        slots = self._slots
        if slots is not None:  # the semaphore lives on the pool's loop
            for _ in range(extra):
                self._thread.loop.call_soon_threadsafe(slots.release)

    def close(self) -> None:
        """Close the browser and stop the pool's thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._thread.submit(self._shutdown()).result(timeout=LAUNCH_TIMEOUT_S)
        self._thread.stop()

    # -- on the pool's thread ---------------------------------------------------------

    async def _open(
        self, origin: str, cookies: Sequence[dict[str, Any]], start_path: str
    ) -> BrowserSession:
        if self._closed:
            raise RuntimeError("the browser pool is closed")
        origin = origin_of(origin)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_contexts)
        await self._slots.acquire()
        async with self._opening:  # one at a time: see `_opening`
            try:
                session = await self._new_session(origin, cookies)
            except BaseException:
                self._slots.release()
                raise
            try:
                await session.start(start_path)
            except BaseException:
                await session.close()  # its context and its slot
                raise
        return session

    async def _new_session(self, origin: str, cookies: Sequence[dict[str, Any]]) -> BrowserSession:
        """A context and page on a live browser: a dead one is replaced before, and a
        browser that fails or hangs while making the context is killed and replaced once."""
        for attempt in (1, 2):
            browser = await self._live_browser()
            try:
                context = await asyncio.wait_for(
                    self._new_context(browser, origin, cookies), self.action_timeout_s
                )
                break
            except Exception as exc:
                await self._discard_browser()
                if attempt == 2:
                    raise _broken(exc, "opening a browser context") from exc
        assert self._slots is not None
        return BrowserSession(
            context=context,
            page=context.pages[0],
            origin=origin,
            timeout_s=self.action_timeout_s,
            max_lines=self.max_lines,
            release=self._slots.release,
            alive=self._alive,
            run=self._thread,
        )

    async def _new_context(
        self, browser: Browser, origin: str, cookies: Sequence[dict[str, Any]]
    ) -> BrowserContext:
        context = await browser.new_context(accept_downloads=False, service_workers="block")
        context.set_default_timeout(self.action_timeout_s * 1000)
        if cookies:  # Playwright's `SetCookieParam`s: a cookie without a place gets `origin`
            given = [c if ("url" in c or "domain" in c) else {**c, "url": origin} for c in cookies]
            await context.add_cookies(cast("list[SetCookieParam]", given))
        await context.new_page()
        return context

    async def _live_browser(self) -> Browser:
        if self._browser is not None and self._alive():
            return self._browser
        await self._discard_browser()
        if self._playwright is None:
            from playwright.async_api import async_playwright

            self._playwright = await async_playwright().start()
        if self.executable is None:
            from rldojo.envs.web_crm.chromium import find_chromium

            own = self._playwright.chromium.executable_path
            self.executable = find_chromium(playwright_path=lambda: own).path
        tag = f"--rldojo-browser={uuid.uuid4().hex}"  # marks the process: `_find_pid`
        try:
            self._browser = await self._playwright.chromium.launch(
                executable_path=self.executable,
                args=[*self.args, tag],
                timeout=LAUNCH_TIMEOUT_S * 1000,
            )
        except Exception as exc:
            raise BrowserCrashed(f"Chromium did not start: {exc}".splitlines()[0]) from exc
        self._pid = _find_pid(tag)
        return self._browser

    def _alive(self) -> bool:
        """Whether the browser is connected and its process still runs."""
        if self._browser is None or not self._browser.is_connected():
            return False
        return self._pid is None or _process_runs(self._pid)

    async def _discard_browser(self, *, gently: bool = False) -> None:
        """Forget the browser: its process killed (a frozen one cannot close itself), or
        with `gently` closed first within a bound, then its connection closed."""
        browser, pid = self._browser, self._pid
        self._browser, self._pid = None, None
        if gently and browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 5)
        if pid is not None and _process_runs(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if browser is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.close(), 5)

    async def _shutdown(self) -> None:
        await self._discard_browser(gently=True)
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.stop()
            self._playwright = None


def _broken(exc: BaseException, doing: str) -> Exception:
    if isinstance(exc, BrowserCrashed | BrowserTimeout):
        return exc
    if isinstance(exc, TimeoutError):
        return BrowserTimeout(f"the browser did not answer while {doing}")
    return BrowserCrashed(f"the browser failed while {doing}: {exc}".splitlines()[0])


def _find_pid(tag: str) -> int | None:
    """The Chromium browser process started with switch `tag` (not its renderers and
    helpers, which carry `--type=`), read from /proc; None where there is no /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if tag.encode() in argv and not any(a.startswith(b"--type=") for a in argv):
            return int(entry.name)
    return None


def _process_runs(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
