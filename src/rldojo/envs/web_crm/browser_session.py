"""One episode's page in the web-crm-v1 browser: what it may reach, how it is read
(`observe`, through `page_text`) and the agent's actions on it (`act`).

Closed to everything else: every request of the context is routed and those off the
origin are aborted; popups are closed as they open; downloads are refused; a click whose
link or form leads off the origin (another host, file:, data:, chrome:, javascript:) and
a `goto` anywhere but the origin are refused before they run, since Chromium drops some
of those navigations without a request to abort. If a page still ends off the origin it
is taken back. Each refusal is counted by kind in `refused`; one an action caused is
also that action's `ActionError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urljoin, urlsplit

from rldojo.envs.web_crm.page_text import (
    CLICK_JS,
    CLICK_TARGET_JS,
    MAX_OPTIONS,
    MAX_VALUE_CHARS,
    NO_WINDOW_OPEN_JS,
    REF_ATTR,
    WALK_JS,
    PageText,
    origin_of,
    outside_kind,
    render,
    window_start,
)

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Download, Frame, Page, Route

__all__ = [
    "ACTIONS",
    "ActionError",
    "BrowserCrashed",
    "BrowserSession",
    "BrowserTimeout",
    "origin_of",
    "outside_kind",
]

T = TypeVar("T")

ACTIONS: dict[str, dict[str, type]] = {
    "click": {"ref": int},
    "type": {"ref": int, "text": str},
    "select": {"ref": int, "option": str},
    "goto": {"path": str},
    "back": {},
    "scroll": {"direction": str},
}
"""The agent's actions and their arguments."""


class ActionError(ValueError):
    """The agent's action could not be done (a bad argument, an unknown or stale ref, a
    refused navigation); the message is the line the agent reads."""


class BrowserCrashed(RuntimeError):
    """The browser process died or failed; the episode's session is gone."""


class BrowserTimeout(RuntimeError):
    """The browser did not finish an action or observation within the pool's bound."""


class _NoNavigation(Exception):
    """A click that started no navigation: ends the wait for one without waiting."""


class _Runner(Protocol):
    async def run(self, coro: Coroutine[Any, Any, T]) -> T: ...

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T: ...


class BrowserSession:
    """One episode's isolated browser context and page on one origin (made by
    `BrowserPool.open`). `refused` counts refusals by kind."""

    def __init__(
        self,
        *,
        context: BrowserContext,
        page: Page,
        origin: str,
        timeout_s: float,
        max_lines: int,
        release: Callable[[], None],
        alive: Callable[[], bool],
        run: _Runner,
    ) -> None:
        self.origin = origin
        self.refused: dict[str, int] = {}
        self._context, self._page = context, page
        self._timeout_s, self._max_lines = timeout_s, max_lines
        self._release: Callable[[], None] | None = release
        self._alive, self._run = alive, run
        self._gen, self._seen = 0, PageText(origin, "", [], [], [])
        self._top = 0
        self._last_good = origin + "/"
        self._caused: list[tuple[str, str]] = []  # refusals of the running action
        self._tasks: set[asyncio.Future[None]] = set()
        context.on("page", self._on_popup)
        page.on("download", self._on_download)
        page.on("framenavigated", self._on_navigated)

    # -- public, from any event loop ----------------------------------------------------

    async def observe(self) -> str:
        """The page as text (see `page_text`); numbers its elements for the next action."""
        return await self._run.run(self._guard(self._observe(), "observe"))

    async def act(self, name: str, args: dict[str, Any] | None = None) -> None:
        """Do one action (`ACTIONS`) and wait for the page to settle. Raises `ActionError`
        for the agent's mistakes and refused navigations."""
        await self._run.run(self._guard(self._act(name, args or {}), str(name)))

    async def close(self) -> None:
        """Close the context and free its slot (idempotent; never raises)."""
        await self._run.run(self._close())

    def observe_sync(self) -> str:
        """`observe`, blocking."""
        return self._run.run_sync(self._guard(self._observe(), "observe"))

    def act_sync(self, name: str, args: dict[str, Any] | None = None) -> None:
        """`act`, blocking."""
        self._run.run_sync(self._guard(self._act(name, args or {}), str(name)))

    def close_sync(self) -> None:
        """`close`, blocking."""
        self._run.run_sync(self._close())

    # -- on the pool's thread -----------------------------------------------------------

    async def start(self, path: str) -> None:
        """Route the context through the origin check and load `path` (by the pool)."""
        await self._context.add_init_script(NO_WINDOW_OPEN_JS)
        await self._context.route("**/*", self._on_route)
        await self._guard(self._goto({"path": path}), "open")

    async def _guard(self, work: Awaitable[T], doing: str) -> T:
        """Bound `work` and turn the browser's failures into this module's errors."""
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        try:
            return await asyncio.wait_for(work, self._timeout_s * 1.5 + 1)
        except ActionError:
            raise
        except (TimeoutError, PlaywrightError) as exc:
            if not self._alive():
                await self._close()
                raise BrowserCrashed(f"the browser died during {doing}") from exc
            if isinstance(exc, TimeoutError | PlaywrightTimeout):
                raise BrowserTimeout(
                    f"the page did not settle within {self._timeout_s:g}s during {doing}"
                ) from exc
            message = re.sub(r"^\w+\.\w+: (Error: )?", "", str(exc).splitlines()[0])
            raise ActionError(f"{doing} failed: {message}") from exc

    async def _observe(self) -> str:
        self._gen += 1
        walked = await self._page.evaluate(WALK_JS, [self._gen, MAX_OPTIONS, MAX_VALUE_CHARS])
        self._seen = PageText.from_walk(self._page.url, walked)
        return render(self._seen, self._top, self._max_lines)

    async def _act(self, name: str, args: dict[str, Any]) -> None:
        if name not in ACTIONS:
            raise ActionError(f"unknown action {name!r}: use one of {', '.join(ACTIONS)}")
        args = _checked_args(name, args)
        self._caused = []
        await getattr(self, f"_{name}")(args)
        await self._back_inside()
        if self._caused:
            raise ActionError(_refusal_message(*self._caused[0]))

    async def _element(self, ref: int, roles: tuple[str, ...] = ()) -> tuple[Any, dict[str, Any]]:
        """The element numbered `ref` in the latest observation and what it leads to."""
        role = self._seen.roles.get(ref)
        if role is None:
            raise ActionError(f"unknown ref {ref}: use a number shown in the page")
        info = await self._page.evaluate(CLICK_TARGET_JS, [ref, self._gen])
        if info.get("stale"):
            raise ActionError(f"stale ref {ref}: the page changed, observe again")
        if roles and role not in roles:
            raise ActionError(f"ref {ref} is a {role}, not a {' or '.join(roles)}")
        if info.get("disabled"):
            raise ActionError(f"ref {ref} is disabled")
        return self._page.locator(f'[{REF_ATTR}="{ref}"]'), info

    async def _click(self, args: dict[str, Any]) -> None:
        """Click by the DOM's `click()` (`CLICK_JS`: why not the mouse) and wait, as a mouse
        click would, for a navigation it starts: committed or failed, then loaded."""
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        _, info = await self._element(args["ref"])
        url = info.get("url")
        if url is not None:
            kind = outside_kind(url, self.origin)
            if info.get("download"):
                kind = "download"
            elif info.get("target", "") not in ("", "_self", "_top", "_parent"):
                kind = "popup"
            if kind is not None:
                self._refuse(kind, url)
                raise ActionError(_refusal_message(kind, url))
        clicked: dict[str, Any] = {}
        try:
            async with self._page.expect_navigation(wait_until="load"):
                clicked = await self._page.evaluate(CLICK_JS, [args["ref"], self._gen])
                if not clicked.get("navigates"):
                    raise _NoNavigation
        except _NoNavigation:
            pass
        except PlaywrightError as exc:  # raised by the click, or by its navigation
            if not clicked.get("navigates") or isinstance(exc, PlaywrightTimeout):
                raise
            if self._caused:  # refused by the route: wait for Chromium's error page
                with contextlib.suppress(PlaywrightTimeout):
                    await self._page.wait_for_url(re.compile("^chrome-error:"), timeout=5000)
        if clicked.get("stale"):
            raise ActionError(f"stale ref {args['ref']}: the page changed, observe again")
        if clicked.get("opened"):
            self._refuse("popup", url or self._page.url)

    async def _type(self, args: dict[str, Any]) -> None:
        element, _ = await self._element(args["ref"], ("textbox",))
        await element.fill(args["text"])

    async def _select(self, args: dict[str, Any]) -> None:
        element, info = await self._element(args["ref"], ("combobox",))
        options: list[list[str]] = info["options"]
        wanted = args["option"].strip()
        for pick in (lambda s: s, str.casefold):
            for label, value in options:
                if pick(wanted) in (pick(label), pick(value)):
                    await element.select_option(value=value)
                    return
        shown = ", ".join(label or value for label, value in options)
        raise ActionError(f"ref {args['ref']} has no option {wanted!r}: options are {shown}")

    async def _goto(self, args: dict[str, Any]) -> None:
        path = args["path"].strip()
        if urlsplit(path).scheme:
            url = path
        elif path.startswith("//"):  # another host, scheme-relative
            url = f"{urlsplit(self.origin).scheme}:{path}"
        elif path.startswith("/") and not any(c in path for c in "\\\r\n\t"):
            url = self.origin + path
        else:
            raise ActionError(f"goto takes a path like /deals, not {path!r}")
        kind = outside_kind(url, self.origin)
        if kind is not None:
            self._refuse(kind, url)
            raise ActionError(_refusal_message(kind, url))
        await self._page.goto(url, wait_until="load")

    async def _back(self, args: dict[str, Any]) -> None:
        before = self._page.url
        moved = await self._page.go_back(wait_until="load") is not None
        if self._page.url == "about:blank":  # the empty page every tab starts on
            await self._page.go_forward(wait_until="load")
            moved = False
        if not moved and self._page.url == before:
            raise ActionError("there is no earlier page")

    async def _scroll(self, args: dict[str, Any]) -> None:
        direction = args["direction"].strip().lower()
        if direction not in ("up", "down"):
            raise ActionError(f"scroll takes direction 'up' or 'down', not {direction!r}")
        top = window_start(self._top, len(self._seen.lines), self._max_lines, direction)
        if top == self._top:
            raise ActionError(f"already at the {'top' if direction == 'up' else 'bottom'}")
        self._top = top

    async def _back_inside(self) -> None:
        """Take a page that ended off the origin (an aborted navigation shows Chromium's
        error page) back to where it was."""
        if outside_kind(self._page.url, self.origin) is None:
            return
        if not self._caused:
            self._refuse(outside_kind(self._page.url, self.origin) or "scheme", self._page.url)
        await self._page.go_back(wait_until="load")
        if outside_kind(self._page.url, self.origin) is not None:
            await self._page.goto(self._last_good, wait_until="load")

    async def _close(self) -> None:
        release, self._release = self._release, None
        if release is None:
            return
        release()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._context.close(), self._timeout_s)

    # -- the lockdown's event handlers --------------------------------------------------

    def _refuse(self, kind: str, url: str, *, caused: bool = True) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        if caused:
            self._caused.append((kind, url))

    async def _on_route(self, route: Route) -> None:
        """Let through only this page's requests to the origin. Chromium follows redirects
        without routing them again, so an allowed request is fetched here, unfollowed, and
        a redirect off the origin or a file to save is refused before the page sees it."""
        request = route.request
        try:
            ours = request.frame.page is self._page
            navigates = request.is_navigation_request() and request.frame.parent_frame is None
        except Exception:  # a service worker's request has no frame
            ours = navigates = False
        url = request.url
        kind = outside_kind(url, self.origin) if ours else None
        if ours and kind is None:
            response = await route.fetch(max_redirects=0)
            headers = response.headers
            if 300 <= response.status < 400 and "location" in headers:
                url = urljoin(url, headers["location"])
                kind = outside_kind(url, self.origin)
            elif headers.get("content-disposition", "").lower().startswith("attachment"):
                kind = "download"
            if kind is None:
                await route.fulfill(response=response)
                return
        if kind is not None:  # a popup's requests are the popup's refusal
            self._refuse(kind, url, caused=navigates)
        await route.abort("blockedbyclient")

    def _background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(_quietly(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_popup(self, page: Page) -> None:
        if page is self._page:
            return
        self._refuse("popup", page.url)
        self._background(page.close())

    def _on_download(self, download: Download) -> None:
        self._refuse("download", download.url)
        self._background(download.cancel())

    def _on_navigated(self, frame: Frame) -> None:
        if frame is self._page.main_frame:
            self._top = 0
            if outside_kind(frame.url, self.origin) is None:
                self._last_good = frame.url


def _checked_args(name: str, args: object) -> dict[str, Any]:
    """The action's arguments with types checked (a ref may come as "12" or "[12]")."""
    if not isinstance(args, dict):
        raise ActionError(f"{name} takes an object of arguments, not {type(args).__name__}")
    wanted = ACTIONS[name]
    missing, extra = set(wanted) - set(args), set(args) - set(wanted)
    if missing or extra:
        names = ", ".join(wanted) or "no arguments"
        raise ActionError(f"{name} takes {names}; got {', '.join(sorted(args)) or 'none'}")
    out = dict(args)
    for key, kind in wanted.items():
        value = args[key]
        if kind is int and isinstance(value, str) and value.strip("[] ").isdigit():
            value = int(value.strip("[] "))
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ActionError(f"{name}: {key} must be {kind.__name__}, not {value!r}")
        out[key] = value
    return out


def _refusal_message(kind: str, url: str) -> str:
    if kind == "popup":
        return "opening a new window refused: the application runs in this page only"
    if kind == "download":
        return "download refused: files cannot be saved"
    return f"navigation to {url} refused: outside the application"


async def _quietly(work: Awaitable[Any]) -> None:
    """Await `work` in the background, ignoring its failure (a page already gone)."""
    with contextlib.suppress(Exception):
        await work
