"""The web-crm-v1 browser against a fixture site in a real headless Chromium: the page as
numbered text, actions that post a form, bad and stale refs, every way off the origin
refused and counted (the site's request log proves nothing else was fetched), a killed or
frozen browser replaced, and the cost of an action plus an observation (printed)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import threading
import time

import pytest
from envs.web_crm.fixture_site import make_site

from rldojo.asgi import start_in_thread
from rldojo.envs.web_crm.browser import (
    ActionError,
    BrowserCrashed,
    BrowserPool,
    BrowserSession,
    BrowserTimeout,
)
from rldojo.envs.web_crm.chromium import find_chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,  # a headless browser against a fixture server
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)"
    ),
]
WAIT_S = 30.0
"""Bound on every wait for a condition."""


@pytest.fixture(scope="module")
def site():
    site = make_site()
    server, thread, port = start_in_thread(site.app)
    site.origin = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield site
    server.should_exit = True
    thread.join(timeout=WAIT_S)


@pytest.fixture(scope="module")
def pool():
    pool = BrowserPool(max_contexts=4, action_timeout_s=WAIT_S)  # its binary found at launch
    yield pool
    pool.close()


def opened(pool: BrowserPool, site, path: str = "/") -> BrowserSession:
    cookie = {"name": "rldojo_episode", "value": "ep-7"}
    return pool.open_sync(site.origin, cookies=[cookie], start_path=path)


def ref(text: str, role: str, name: str) -> int:
    """The number the observation gave the element with this role and name."""
    found = re.search(rf'\[(\d+)\] {role} "{re.escape(name)}"', text)
    assert found, f'no {role} "{name}" in:\n{text}'
    return int(found.group(1))


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_observe_numbers_elements_with_names_values_options_and_rows(pool, site):
    session = opened(pool, site)
    assert pool.executable == find_chromium().path  # Playwright's own, else the system's
    text = session.observe_sync()
    lines = text.splitlines()
    assert lines[0] == "Page: / — Deals"
    assert '[1] link "Deals" [2] link "Traps" [3] link "Long"' in lines
    assert "# Deals" in lines and "Episode ep-7. Ten open deals." in lines  # the cookie
    assert "| ID | Name | Stage |" in lines
    assert '| [4] link "DEAL-0001" | Account 1 renewal | qualification |' in lines
    assert '[14] link "Next"' in lines
    assert "hidden text" not in text and "csrf" not in text
    assert len(text.split()) < 200, text
    session.act_sync("goto", {"path": "/deals/3"})
    text = session.observe_sync()
    assert text.splitlines()[0] == "Page: /deals/3 — DEAL-0003"
    for line in [
        '[4] textbox "Amount" type=number value="1300"',
        '[5] combobox "Stage" value="Negotiation" options: Prospecting, Qualification, '
        "Proposal, Negotiation, Closed Won",
        '[6] checkbox "Won" unchecked',
        '[7] textbox "Notes"',  # aria-label
        '[8] textbox "Owner email" type=email',  # placeholder
        '[9] button "Save" [10] button "Archive" disabled',
    ]:
        assert line in text.splitlines(), text
    session.close_sync()


def test_type_select_click_post_the_form_then_flash_and_alert(pool, site):
    session = opened(pool, site)
    session.act_sync("click", {"ref": ref(session.observe_sync(), "link", "DEAL-0002")})
    text = session.observe_sync()
    assert text.startswith("Page: /deals/2 — DEAL-0002")
    session.act_sync("type", {"ref": ref(text, "textbox", "Amount"), "text": "4200"})
    session.act_sync("select", {"ref": ref(text, "combobox", "Stage"), "option": "negotiation"})
    session.act_sync("click", {"ref": ref(text, "checkbox", "Won")})
    session.act_sync("type", {"ref": ref(text, "textbox", "Notes"), "text": "call Ann"})
    text = session.observe_sync()
    assert '"Amount" type=number value="4200"' in text and '"Won" checked' in text
    assert 'value="Negotiation"' in text
    session.act_sync("click", {"ref": ref(text, "button", "Save")})
    assert site.posts[-1] == {"amount": "4200", "stage": "negotiation", "won": "yes",
                              "notes": "call Ann", "owner": ""}  # fmt: skip
    text = session.observe_sync()
    assert text.splitlines()[:2] == ["Page: /?saved=1 — Deals", "Status: Deal saved"]
    session.act_sync("back")
    text = session.observe_sync()
    assert text.startswith("Page: /deals/2")
    session.act_sync("type", {"ref": ref(text, "textbox", "Amount"), "text": "-5"})
    session.act_sync("click", {"ref": ref(text, "button", "Save")})
    assert session.observe_sync().splitlines()[1] == "Alert: Amount must be a whole number"
    session.close_sync()


MISTAKES = [
    ("back", {}, "there is no earlier page"),  # first: the session has just opened
    ("click", {"ref": 99}, "unknown ref 99: use a number shown in the page"),
    ("click", {"ref": "[4]", "x": 1}, "click takes ref; got ref, x"),
    ("click", {}, "click takes ref; got none"),
    ("click", {"ref": True}, "click: ref must be int, not True"),
    ("type", {"ref": 4, "text": 5}, "type: text must be str, not 5"),
    ("type", {"ref": 4, "text": "x"}, "ref 4 is a link, not a textbox"),
    ("select", {"ref": 1, "option": "x"}, "ref 1 is a link, not a combobox"),
    ("goto", {"path": "deals"}, "goto takes a path like /deals"),
    ("scroll", {"direction": "down"}, "already at the bottom"),
    ("scroll", {"direction": "left"}, "scroll takes direction 'up' or 'down'"),
    ("fly", {}, "unknown action 'fly': use one of click, type, select, goto, back, scroll"),
]
"""Actions the agent gets wrong on the list page, and the line it reads back."""


def test_mistakes_are_action_errors_and_leave_the_page(pool, site):
    session = opened(pool, site)
    for name, args, message in MISTAKES:
        assert session.observe_sync().startswith("Page: / — Deals")
        with pytest.raises(ActionError, match=re.escape(message)):
            session.act_sync(name, args)
    assert session.observe_sync().startswith("Page: / — Deals")
    session.act_sync("click", {"ref": "[4]"})  # a ref as the model may write it
    assert session.observe_sync().startswith("Page: /deals/1")
    session.close_sync()


def test_unknown_option_and_stale_ref(pool, site):
    session = opened(pool, site, "/deals/1")
    text = session.observe_sync()
    stage = ref(text, "combobox", "Stage")
    with pytest.raises(ActionError, match="has no option 'won': options are Prospecting, Qual"):
        session.act_sync("select", {"ref": stage, "option": "won"})
    session.act_sync("select", {"ref": stage, "option": "Closed Won"})  # by label
    session.act_sync("click", {"ref": ref(text, "link", "Deals")})
    with pytest.raises(ActionError, match="stale ref 4: the page changed, observe again"):
        session.act_sync("click", {"ref": 4})  # from the form, not observed since
    session.act_sync("click", {"ref": ref(session.observe_sync(), "link", "DEAL-0001")})
    assert session.observe_sync().startswith("Page: /deals/1")
    session.close_sync()


TRAPS = [
    ("link", "other host", "host", "navigation to http://example.invalid/ refused"),
    ("link", "a file", "file", "navigation to file:///etc/passwd refused"),
    ("link", "data", "data", "navigation to data:text/html,<h1>hi</h1> refused"),
    ("link", "chrome", "chrome", "navigation to chrome://version/ refused"),
    ("link", "script", "javascript", "navigation to javascript:location.href="),
    ("link", "new tab", "popup", "opening a new window refused"),
    ("button", "open window", "popup", "opening a new window refused"),
    ("link", "export", "download", "download refused"),
    ("link", "attachment", "download", "download refused"),
    ("link", "redirect away", "host", "navigation to http://example.invalid/landing refused"),
    ("button", "Send away", "host", "navigation to http://example.invalid/steal refused"),
]
"""What the fixture's /traps page offers: role, name, refusal kind, the agent's message."""


def test_everything_off_the_origin_is_refused_and_counted(pool, site):
    session = opened(pool, site, "/image")
    assert session.refused == {"host": 1}  # the page's off-site image, not the agent's doing
    assert "a pixel" in session.observe_sync()
    start = len(site.hits)
    session.act_sync("goto", {"path": "/traps"})
    for role, name, kind, message in TRAPS:
        text = session.observe_sync()
        before = session.refused.get(kind, 0)
        with pytest.raises(ActionError, match=re.escape(message)):
            session.act_sync("click", {"ref": ref(text, role, name)})
        assert session.refused[kind] == before + 1, (name, session.refused)
        assert session.observe_sync().startswith("Page: /traps — Traps"), name
    for path, kind in [("http://example.invalid/x", "host"), ("//example.invalid/x", "host"),
                       ("file:///etc/passwd", "file"), ("chrome://version", "chrome")]:  # fmt: skip
        before = session.refused.get(kind, 0)
        with pytest.raises(ActionError, match="refused: outside the application"):
            session.act_sync("goto", {"path": path})
        assert session.refused[kind] == before + 1
    assert session.observe_sync().startswith("Page: /traps — Traps")
    # /attachment and /away answer (the answer is refused); nothing else left the page
    fetched = set(site.hits[start:])
    assert fetched <= {"/attachment", "/away", "/traps"}, fetched
    assert not {"/popup-target", "/opened", "/export.csv", "/stolen"} & set(site.hits)
    session.close_sync()


def test_scroll_moves_a_window_over_a_long_page(pool, site):
    session = opened(pool, site, "/long")  # the nav line and 200 paragraphs
    text = session.observe_sync()
    body = text.splitlines()[2:]
    assert len(body) == pool.max_lines + 1 and body[-1] == "(… 121 more lines: scroll down)"
    assert "Line 79 of the long page." in body and "Line 80 of the long page." not in text
    session.act_sync("scroll", {"direction": "down"})
    text = session.observe_sync()
    assert "(… 78 lines above: scroll up)" in text and "Line 78 of the long page." in text
    session.act_sync("scroll", {"direction": "down"})  # as far as the last line
    text = session.observe_sync()
    assert text.endswith("Line 200 of the long page.") and "more lines" not in text
    with pytest.raises(ActionError, match="already at the bottom"):
        session.act_sync("scroll", {"direction": "down"})
    session.act_sync("goto", {"path": "/long"})  # a new page starts at its top
    assert "(… 121 more lines: scroll down)" in session.observe_sync()
    session.close_sync()


def test_sessions_work_from_several_event_loops(pool, site):
    async def open_and_read() -> tuple[BrowserSession, str]:
        session = await pool.open(site.origin)
        return session, await session.observe()

    session, text = asyncio.run(open_and_read())  # one loop
    assert text.startswith("Page: / — Deals")

    async def follow() -> str:
        await session.act("click", {"ref": ref(text, "link", "Traps")})
        return await session.observe()

    assert asyncio.run(follow()).startswith("Page: /traps")  # another loop
    asyncio.run(session.close())


def test_a_full_pool_waits_and_allow_makes_room(site):
    pool = BrowserPool(max_contexts=1, action_timeout_s=WAIT_S, executable=CHROMIUM)
    got: list[BrowserSession] = []
    try:
        first = opened(pool, site)
        waiter = threading.Thread(target=lambda: got.append(opened(pool, site)), daemon=True)
        waiter.start()  # it waits: the one slot is taken, and nothing frees it
        pool.allow(2)
        pool.allow(1)  # never lowers it
        assert pool.max_contexts == 2
        waiter.join(timeout=WAIT_S)
        assert got, "the second open still waits after allow(2)"
        assert got[0].observe_sync().startswith("Page: / — Deals")
        got[0].close_sync()
        first.close_sync()
    finally:
        pool.close()


def test_opens_asked_for_together_run_one_at_a_time(site):
    """Opens asked for together queue in the pool, not inside Chromium, so each open's
    timeout measures its own work (48 at once used to time out and kill the browser)."""
    pool = BrowserPool(max_contexts=12, action_timeout_s=WAIT_S, executable=CHROMIUM)
    inner, active, most = pool._new_session, [0], [0]

    async def counted(*args, **kwargs):
        active[0] += 1
        most[0] = max(most[0], active[0])
        try:
            return await inner(*args, **kwargs)
        finally:
            active[0] -= 1

    pool._new_session = counted  # type: ignore[method-assign]
    cookie = {"name": "rldojo_episode", "value": "ep-7"}

    async def open_all() -> list[BrowserSession]:
        return await asyncio.gather(*(pool.open(site.origin, cookies=[cookie]) for _ in range(12)))

    try:
        sessions = asyncio.run(open_all())
        assert most[0] == 1
        assert all(s.observe_sync().startswith("Page: / — Deals") for s in sessions)
        for s in sessions:
            s.close_sync()
    finally:
        pool.close()


def test_a_killed_browser_is_crashed_and_the_next_open_relaunches(site):
    pool = BrowserPool(max_contexts=2, action_timeout_s=WAIT_S, executable=CHROMIUM)
    try:
        session = opened(pool, site)
        session.observe_sync()
        pid = pool.browser_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _runs(pid), "the killed browser to be gone")
        with pytest.raises(BrowserCrashed):
            session.act_sync("click", {"ref": 4})
        session.close_sync()  # no error, and the slot is free again
        again = opened(pool, site)
        assert again.observe_sync().startswith("Page: / — Deals")
        assert pool.browser_pid not in (None, pid)
        again.close_sync()
    finally:
        pool.close()


def test_a_frozen_browser_times_out_and_the_next_open_relaunches(site):
    pool = BrowserPool(max_contexts=2, action_timeout_s=2, executable=CHROMIUM)
    try:
        session = opened(pool, site)
        session.observe_sync()
        pid = pool.browser_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(BrowserTimeout):
            session.act_sync("goto", {"path": "/traps"})
        session.close_sync()
        again = opened(pool, site)  # the frozen one is killed, a new one started
        assert again.observe_sync().startswith("Page: / — Deals")
        assert pool.browser_pid != pid and not _runs(pid)
        again.close_sync()
    finally:
        pool.close()


def _runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
