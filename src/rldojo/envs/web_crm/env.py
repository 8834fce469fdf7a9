"""`WebCrmEnv`: web-crm-v1, the CRM twin operated through a real browser, in text.

An episode: `reset` loads the task's start database into the environment's own SQLite
connection (crm-v1's snapshot), opens a session for it on the process's loopback web
server (`server`) and an isolated Chromium context from the process's pool (`browser`),
and shows the request with the home page as text. Each policy turn is one or more
browser actions in ``<tool_call>`` tags (`ACTIONS`), run in order; the reply is the page
after the last one, as text (`page_text`), or the error of the action that failed (an
unknown ref, a stale page, a refused navigation: a tool error the model can correct;
later calls of that turn are skipped). The episode ends at ``<answer>`` (or the
``answer`` action) or a limit; the browser context is released then.

The reward is crm-v1's (`CrmGrader`): the database diff against the task's expectations,
the facts in the answer, false claims. A browser that crashes or hangs raises out of
`step`, so the rollout is `env_error` or `timeout`, never a score; the pool starts a new
browser for the next episode. Info adds ``web/refused`` (navigations, popups and
downloads refused, by kind) and ``web/actions`` to crm-v1's keys.

Snapshot = the serialized database plus the page's path; restoring reloads that path on
the next turn (typed form values are not kept: a snapshot is taken between pages).
"""

from __future__ import annotations

import importlib.util
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from rldojo.envs.base import EnvUnavailableError
from rldojo.envs.crm.data import base_snapshot, connect, diff, state_digest
from rldojo.envs.crm.env import CrmDatabaseKwargs
from rldojo.envs.crm.grader import CrmGrader
from rldojo.envs.crm.tasks import scenario_tasks
from rldojo.envs.kwargs import EpisodeLimits, subset_of
from rldojo.envs.multiturn import ToolEnv, TurnOutcome
from rldojo.envs.registry import register
from rldojo.envs.tool_calls import parse_turn
from rldojo.envs.tools import Tool
from rldojo.envs.web_crm.tasks import LEVELS, WEB_TEMPLATES
from rldojo.envs.web_crm.tools import ACTION_TOOLS, BROWSER_ACTIONS
from rldojo.types import Message, StepResult, Task

if TYPE_CHECKING:
    from rldojo.envs.web_crm.browser import BrowserPool, BrowserSession
    from rldojo.envs.web_crm.server import Session

__all__ = ["ENV_ID", "WebCrmEnv", "WebCrmKwargs", "shared_pool"]

ENV_ID = "web-crm-v1"

INSTRUCTIONS = (
    "You are the CRM assistant of a sales and support team. You operate the CRM's web "
    "application in a browser: each page is shown as text, with a number in brackets before "
    "every link, field and button. Act on them with the tools, by number; never guess ids, "
    "read them from the pages. Change only what the user asks for. End with your reply to "
    "the user in <answer>...</answer>, stating the facts they asked for, or plainly what "
    "could not be done."
)


DEFAULT_CONTEXTS = 64
"""Browser contexts (episodes) a process holds at once unless `browser_contexts` says."""
_POOL: BrowserPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool(max_contexts: int = DEFAULT_CONTEXTS, executable: str | None = None) -> BrowserPool:
    """The process's Chromium pool (one browser, a context per episode), made on first use
    with `executable` (None: found at launch, `rldojo.envs.web_crm.chromium`; the process
    keeps the first env's browser); it holds at least `max_contexts` contexts at once (the
    largest any env asked for)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from rldojo.envs.web_crm.browser import BrowserPool

            _POOL = BrowserPool(max_contexts=max_contexts, executable=executable)
        _POOL.allow(max_contexts)
        return _POOL


class WebCrmKwargs(CrmDatabaseKwargs):
    """The kwargs of web-crm-v1 (`[env] kwargs`); the tool-use ones are `ToolEnvKwargs`'."""

    levels: Sequence[int] = LEVELS
    """Horizon levels to draw tasks from, a non-empty subset of 1 (a lookup), 2 (an edit
    form), 3 (create forms with a validation error to fix), 4 (several records)."""
    limits: EpisodeLimits = EpisodeLimits(max_turns=24)
    """Per-episode limits (a table); keys left out keep web-crm-v1's: max_turns = 24 and
    the other defaults."""
    browser_contexts: int = Field(DEFAULT_CONTEXTS, gt=0)
    """Episodes this process holds open at once, one Chromium context each (~70 MiB).
    The rollout engine opens a whole batch before its first turn, so a run's
    `eval.tasks` and `rollout.prompts_per_step` x `group_size` must fit (checked before
    the run starts)."""
    chromium_path: str | None = None
    """The Chromium binary to drive (a path, or a command on the PATH). None: the
    environment variable `RLDOJO_CHROMIUM`, else Playwright's own browser (`playwright
    install chromium`), else `chromium`, `chromium-browser` or `google-chrome` on the PATH."""

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, levels: Sequence[int]) -> tuple[int, ...]:
        return subset_of(levels, LEVELS)


class WebCrmEnv(ToolEnv):
    """web-crm-v1 (see the module docstring); built from `WebCrmKwargs` (or keywords
    validated against it)."""

    env_id = ENV_ID
    instructions = INSTRUCTIONS
    Kwargs = WebCrmKwargs
    kwargs: WebCrmKwargs
    max_episodes_at_once_key = "browser_contexts"

    def __init__(self, kwargs: WebCrmKwargs | None = None, /, **keywords: object) -> None:
        super().__init__(kwargs, **keywords)
        self.chromium = _check_browser(self.kwargs.chromium_path)
        self.levels = tuple(self.kwargs.levels)
        self.max_episodes_at_once = self.kwargs.browser_contexts
        self.reward = self.kwargs.reward
        self.conn = connect()
        self.conn.deserialize(base_snapshot(0, self.kwargs.db_size))
        self._server: Session | None = None
        self._browser: BrowserSession | None = None
        self._page = ""  # the latest observation, the opening's page
        self._path = "/"  # where a restored episode continues
        self._reload = False
        self._refused: dict[str, int] = {}
        self._finalizer: weakref.finalize | None = None

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return scenario_tasks(
            ENV_ID,
            split,
            seed=seed,
            n=n,
            levels=self.levels,
            n_databases=self.kwargs.n_databases,
            db_size=self.kwargs.db_size,
            templates=WEB_TEMPLATES,
        )

    def build_tools(self) -> list[Tool]:
        return list(ACTION_TOOLS)

    def default_grader(self) -> CrmGrader:
        return CrmGrader(self.reward)

    # ---------------------------------------------------------------- the browser

    async def _open_browser(self) -> BrowserSession:
        """This episode's server session and browser context, opened on first use."""
        if self._server is None:
            from rldojo.envs.web_crm.server import shared_server

            self._server = shared_server().open_session(self.conn)
        if self._browser is None:
            cookie = self._server.cookie
            pool = shared_pool(self.max_episodes_at_once, self.chromium)
            self._browser = await pool.open(self._server.origin, cookies=[cookie])
            self._finalizer = weakref.finalize(self, _release_dropped, self._browser)
            self._reload = self._path != "/"
        if self._reload:
            self._reload = False
            await self._browser.act("goto", {"path": self._path})
        return self._browser

    async def _release(self) -> None:
        """Give the browser context back (the database stays, for the grader)."""
        browser, self._browser = self._browser, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if browser is not None:
            self._refused = dict(browser.refused)
            await browser.close()

    async def _observe(self, browser: BrowserSession) -> str:
        self._page = await browser.observe()
        first = self._page.split("\n", 1)[0]
        self._path = first.removeprefix("Page: ").split(" — ")[0] or "/"
        return self._page

    # ---------------------------------------------------------------- episode and state

    async def setup(self, task: Task, seed: int) -> None:
        await self._release()
        db = task.info.get("db") or {}
        snapshot = base_snapshot(int(db.get("seed", 0)), str(db.get("size", self.kwargs.db_size)))
        with self._lock():
            self.conn.deserialize(snapshot)
        self._path, self._reload, self._refused = "/", False, {}
        await self._observe(await self._open_browser())  # a new context opens on "/"

    def opening(self, task: Task) -> list[Message]:
        system, request = super().opening(task)
        page = f"{request['content']}\n\nThe browser shows:\n{self._page}"
        return [system, {"role": "user", "content": page}]

    async def turn(self, action: str) -> TurnOutcome:
        ep = self.episode
        parsed = parse_turn(action, max_calls=self.kwargs.max_calls_per_turn)
        messages = [self._error(e.kind, e.message) for e in parsed.errors]
        for e in parsed.errors:
            ep.bump(e.kind)
            ep.bump("errors")
        answer = parsed.answer
        for i, call in enumerate(parsed.calls):
            if call.name == "answer":
                answer = str(call.arguments.get("text", "")) if answer is None else answer
                messages.append(_response("ok"))
                continue
            last = i == len(parsed.calls) - 1 or parsed.calls[i + 1].name == "answer"
            ok, text = await self._act(call.name, call.arguments, observe=last)
            messages.append(_response(text))
            if not ok:
                skipped = len(parsed.calls) - i - 1
                if skipped:
                    messages.append(_response(f"{skipped} later call(s) skipped"))
                break
        if answer is not None:
            ep.answer = answer
            return TurnOutcome(messages, done=True, done_reason="answer")
        if not parsed.calls and not parsed.errors:
            return await super().turn(action)  # the reminder (or the end) of a turn with no call
        return TurnOutcome(messages)

    async def _act(
        self, name: str, arguments: dict[str, Any], *, observe: bool
    ) -> tuple[bool, str]:
        """Run one action: (True, the page or "ok") or (False, the error and the page)."""
        from rldojo.envs.web_crm.browser import ActionError, BrowserTimeout

        ep = self.episode
        if name not in BROWSER_ACTIONS:
            ep.bump("unknown_tool")
            ep.bump("errors")
            known = ", ".join(t.name for t in ACTION_TOOLS)
            return False, f"error: unknown tool {name!r}; available: {known}"
        browser = await self._open_browser()
        try:
            await browser.act(name, arguments)
        except ActionError as exc:
            ep.bump("tool_error")
            ep.bump("errors")
            return False, f"error: {exc}\n\n{await self._observe(browser)}"
        except BrowserTimeout as exc:
            raise TimeoutError(f"{ENV_ID}: the browser did not answer: {exc}") from exc
        ep.bump("calls")
        ep.by_name[name] = ep.by_name.get(name, 0) + 1
        return True, await self._observe(browser) if observe else "ok"

    def _error(self, kind: str, message: str) -> Message:
        return _response(f"error: {kind}: {message}")

    async def step(self, action: str) -> StepResult:
        result = await super().step(action)
        if result.done:
            await self._release()
        return result

    def _web_info(self) -> dict[str, Any]:
        refused = dict(self._browser.refused) if self._browser else dict(self._refused)
        return {"web/refused": refused, "web/refusals": sum(refused.values())}

    def _lock(self) -> threading.Lock | _NoLock:
        return self._server.lock if self._server is not None else _NoLock()

    def state_info(self) -> dict[str, Any]:
        with self._lock():
            changes = diff(self.conn)
            info: dict[str, Any] = {"crm/diff": changes, "crm/changed_rows": len(changes)}
            if self.episode.done:
                info["crm/digest"] = state_digest(self.conn)
        return {**info, **self._web_info()}

    def save_state(self) -> tuple[bytes, str]:
        with self._lock():
            return self.conn.serialize(), self._path

    def load_state(self, state: object) -> None:
        assert isinstance(state, tuple), "a snapshot's world is (database, page path)"
        data, path = state
        with self._lock():
            self.conn.deserialize(data)
        self._path, self._reload = path, True

    async def close(self) -> None:
        await super().close()
        await self._release()
        if self._server is not None:
            from rldojo.envs.web_crm.server import shared_server

            shared_server().close_session(self._server.token)
            self._server = None

    def __del__(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()


def _check_browser(chromium_path: str | None) -> str:
    """The Chromium binary to drive (`rldojo.envs.web_crm.chromium`): Playwright and a
    browser must be there before any episode, else an `EnvUnavailableError` (one line)."""
    from rldojo.envs.web_crm.chromium import find_chromium

    if importlib.util.find_spec("playwright") is None:
        raise EnvUnavailableError(
            f"{ENV_ID}: Playwright is not installed: pip install 'rldojo[web]'"
        )
    try:
        return find_chromium(chromium_path).path
    except EnvUnavailableError as exc:
        raise EnvUnavailableError(f"{ENV_ID}: {exc}") from None


class _NoLock:
    """Stands in for the session lock before the first episode (nothing else uses the db)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _response(text: str) -> Message:
    return {"role": "tool", "content": f"<tool_response>\n{text}\n</tool_response>"}


def _release_dropped(browser: BrowserSession) -> None:
    """An environment dropped without `close()`: its browser context goes back anyway."""
    try:
        browser.close_sync()
    except Exception:
        pass


register(ENV_ID, WebCrmEnv)
