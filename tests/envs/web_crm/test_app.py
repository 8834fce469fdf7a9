"""web-crm-v1's web application and server: lists, search and pagination, detail pages
that link their neighbours, forms that refuse with an alert and keep the values, writes
whose database diff equals the one `CrmApi` leaves, the confirmation before a ticket
closes, the 403 without an episode cookie, and sessions isolated on one real server."""

from __future__ import annotations

import html
import math
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from rldojo.envs.crm.api import CrmApi
from rldojo.envs.crm.data import TODAY, base_snapshot, connect, diff
from rldojo.envs.web_crm.app import create_app
from rldojo.envs.web_crm.episode import COOKIE, Episode
from rldojo.envs.web_crm.server import WebCrmServer, shared_server


def _database() -> sqlite3.Connection:
    conn = connect()
    conn.deserialize(base_snapshot(0, "small"))
    return conn


@pytest.fixture
def db() -> sqlite3.Connection:
    return _database()


@pytest.fixture
def client(db: sqlite3.Connection) -> TestClient:
    episode = Episode(db)
    app = create_app(lambda token: episode if token == "tok" else None)
    return TestClient(app, cookies={COOKIE: "tok"}, follow_redirects=False)


def _one(conn: sqlite3.Connection, sql: str, *params: object) -> Any:
    return conn.execute(sql, params).fetchone()[0]


def _alert(page: str) -> str:
    found = re.search(r'role="alert">(.*?)</div>', page)
    assert found, "no alert on the page"
    return html.unescape(found.group(1))


def _hrefs(page: str, prefix: str) -> list[str]:
    return re.findall(rf'href="({re.escape(prefix)}[^"?]+)"', page)


def _words(page: str) -> int:
    return len(re.sub(r"<style>.*?</style>|<[^>]+>", " ", page).split())


# ------------------------------------------------------------------ reading


def test_lists_search_and_paginate(client: TestClient, db: sqlite3.Connection):
    total = _one(db, "SELECT COUNT(*) FROM deals")
    pages = math.ceil(total / 10)
    first = client.get("/deals").text
    assert f"Page 1 of {pages}" in first and 'href="/deals?page=2">Next<' in first
    assert "Previous" not in first and first.count("<tr>") == 11  # header + 10 rows
    assert _words(first) < 300
    last = client.get(f"/deals?page={pages}").text
    assert f"Page {pages} of {pages}" in last and ">Previous<" in last and ">Next<" not in last
    assert f"Page {pages} of {pages}" in client.get("/deals?page=999").text
    assert "Page 1 of" in client.get("/deals?page=junk").text

    name = _one(db, "SELECT name FROM deals WHERE id = 'DEAL-0001'")
    hits = client.get("/deals", params={"q": name}).text
    assert "DEAL-0001" in hits and "Page 1 of 1" in hits
    many = _one(db, "SELECT COUNT(*) FROM deals WHERE name LIKE '%a%'")
    assert many > 10
    second = client.get("/deals", params={"q": "a", "page": 2}).text
    assert 'href="/deals?q=a&amp;page=1">Previous<' in second
    assert client.get("/deals", params={"q": "zzzz"}).text.count("DEAL-") == 0


def test_detail_pages_link_list_to_account_to_deal(client: TestClient, db: sqlite3.Connection):
    acc_id, acc_name = db.execute("SELECT id, name FROM accounts ORDER BY id").fetchone()
    listing = client.get("/accounts", params={"q": acc_name}).text
    assert f"/accounts/{acc_id}" in _hrefs(listing, "/accounts/")
    account = client.get(f"/accounts/{acc_id}").text
    assert f"Account {acc_id}: {acc_name}" in account
    deal_id = _one(db, "SELECT id FROM deals WHERE account_id = ? ORDER BY id", acc_id)
    contact_id = _one(db, "SELECT id FROM contacts WHERE account_id = ? ORDER BY id", acc_id)
    assert f"/deals/{deal_id}" in _hrefs(account, "/deals/")
    assert f"/contacts/{contact_id}" in _hrefs(account, "/contacts/")
    deal = client.get(f"/deals/{deal_id}").text
    assert f"<h1>Deal {deal_id}" in deal and f'href="/accounts/{acc_id}"' in deal
    assert f'href="/deals/{deal_id}/edit">Edit deal<' in deal
    assert acc_name in client.get(f"/contacts/{contact_id}").text
    missing = client.get("/deals/DEAL-9999")
    assert missing.status_code == 404 and "DEAL-9999 not found" in missing.text


def test_every_field_has_a_label_and_no_script(client: TestClient, db: sqlite3.Connection):
    deal = _one(db, "SELECT id FROM deals ORDER BY id")
    ticket = _one(db, "SELECT id FROM tickets ORDER BY id")
    for path in (
        "/accounts",
        f"/deals/{deal}/edit",
        "/accounts/ACC-0001/deals/new",
        "/accounts/ACC-0001/tickets/new",
        "/accounts/ACC-0001/activities/new",
        "/contacts/CON-0001/email",
        f"/tickets/{ticket}/close",
    ):
        page = client.get(path).text
        ids = re.findall(r'<(?:input|select|textarea) id="([^"]+)"', page)
        assert ids and all(f'<label for="{i}">' in page for i in ids), path
        assert "<script" not in page and "<button" in page


# ------------------------------------------------------------------ writing


def test_deal_edit_refuses_keeps_values_then_saves_as_the_api(client: TestClient, db):
    # an open deal whose close date has passed: the untouched date must not be re-sent
    deal_id, close = db.execute(
        "SELECT id, close_date FROM deals WHERE stage NOT LIKE 'closed%' AND close_date < ?"
        " ORDER BY id",
        (TODAY.isoformat(),),
    ).fetchone()
    form = {"stage": "negotiation", "amount": "12k", "close_date": close}
    refused = client.post(f"/deals/{deal_id}/edit", data=form)
    assert refused.status_code == 422
    assert "amount must be a whole number" in _alert(refused.text)
    assert 'value="12k"' in refused.text and '<option value="negotiation" selected>' in refused.text
    form["close_date"] = "2020-01-01"
    form["amount"] = "12,000"
    assert "in the past" in _alert(client.post(f"/deals/{deal_id}/edit", data=form).text)
    assert diff(db) == []

    form["close_date"] = close
    saved = client.post(f"/deals/{deal_id}/edit", data=form)
    assert saved.status_code == 303 and saved.headers["location"] == f"/deals/{deal_id}"
    page = client.get(f"/deals/{deal_id}").text
    assert f'role="status">Deal {deal_id} saved.' in page and "$12,000" in page
    twin = _database()
    CrmApi(twin).update_deal(deal_id, stage="negotiation", amount=12000)
    assert diff(db) == diff(twin) and len(diff(db)) == 1
    assert 'role="status"' not in client.get(f"/deals/{deal_id}").text  # shown once


def test_create_refuses_keeps_values_then_creates_as_the_api(client: TestClient, db):
    acc_id = _one(db, "SELECT account_id FROM contacts ORDER BY id")
    form = {"subject": " ", "description": "Exports stop at 10 MB", "priority": "urgent"}
    refused = client.post(f"/accounts/{acc_id}/tickets/new", data=form)
    assert refused.status_code == 422 and _alert(refused.text) == "subject must not be empty"
    assert "Exports stop at 10 MB</textarea>" in refused.text
    assert '<option value="urgent" selected>' in refused.text
    form["subject"] = "Export fails"
    created = client.post(f"/accounts/{acc_id}/tickets/new", data=form)
    assert created.status_code == 303
    twin = _database()
    row = CrmApi(twin).create_ticket(acc_id, "Export fails", "Exports stop at 10 MB", "urgent")
    assert created.headers["location"] == f"/tickets/{row['id']}"
    assert diff(db) == diff(twin)

    deal_name = _one(db, "SELECT name FROM deals WHERE account_id = ? ORDER BY id", acc_id)
    dup = {"name": deal_name.upper(), "amount": "5000", "stage": "prospecting", "close_date": ""}
    refused = client.post(f"/accounts/{acc_id}/deals/new", data=dup)
    assert "already has a deal named" in _alert(refused.text)
    assert f'value="{html.escape(deal_name.upper())}"' in refused.text


def test_closing_a_ticket_needs_confirmation(client: TestClient, db: sqlite3.Connection):
    tck = _one(db, "SELECT id FROM tickets WHERE status != 'closed' ORDER BY id")
    assert "Close ticket" in client.get(f"/tickets/{tck}").text
    assert client.get(f"/tickets/{tck}/close").status_code == 200
    asked = client.post(f"/tickets/{tck}/close", data={"resolution": "Issued a credit note"})
    assert asked.status_code == 200 and f"Close ticket {tck}?" in asked.text
    assert ">Confirm</button>" in asked.text and ">Cancel</button>" in asked.text
    assert diff(db) == []

    short = client.post(f"/tickets/{tck}/close/confirm", data={"resolution": "ok"})
    assert short.status_code == 422 and "too short" in _alert(short.text)
    assert diff(db) == []
    done = client.post(f"/tickets/{tck}/close/confirm", data={"resolution": "Issued a credit note"})
    assert done.status_code == 303
    twin = _database()
    CrmApi(twin).close_ticket(tck, "Issued a credit note")
    assert diff(db) == diff(twin)
    page = client.get(f"/tickets/{tck}").text
    assert f"Ticket {tck} closed." in page and 'href="/tickets/{tck}/close"' not in page


def test_activity_and_email_go_through_the_api(client: TestClient, db: sqlite3.Connection):
    con, acc = db.execute("SELECT id, account_id FROM contacts WHERE do_not_email = 1").fetchone()
    refused = client.post(f"/contacts/{con}/email", data={"subject": "Hi", "body": "Hello"})
    assert "opted out of email" in _alert(refused.text)
    deal = _one(db, "SELECT id FROM deals WHERE account_id = ?", acc)
    assert (
        f'<option value="{deal}" selected>'
        in client.get(f"/accounts/{acc}/activities/new?deal_id={deal}").text
    )
    form = {"type": "note", "subject": "Scope agreed", "notes": "", "deal_id": deal}
    assert client.post(f"/accounts/{acc}/activities/new", data=form).status_code == 303
    twin = _database()
    CrmApi(twin).log_activity(acc, "note", "Scope agreed", deal_id=deal)
    assert diff(db) == diff(twin)


def test_requests_without_an_episode_cookie_are_forbidden(client: TestClient):
    for cookies in ({}, {COOKIE: "not-a-token"}):
        anonymous = TestClient(client.app, cookies=cookies)
        page = anonymous.get("/deals")
        assert page.status_code == 403 and "DEAL-" not in page.text


# ------------------------------------------------------------------ the real server


@pytest.fixture
def server() -> Iterator[WebCrmServer]:
    running = WebCrmServer()
    yield running
    running.close()


@pytest.mark.slow
def test_sessions_on_one_server_are_isolated(server: WebCrmServer):
    one, two = server.open_session(_database()), server.open_session(_database())
    assert one.origin == two.origin and one.origin.startswith("http://127.0.0.1:")
    assert one.cookie == {"name": COOKIE, "value": one.token, "url": one.origin}
    deal = _one(one.conn, "SELECT id FROM deals WHERE stage NOT LIKE 'closed%' ORDER BY id")
    with httpx.Client(base_url=one.origin, cookies={COOKIE: one.token}) as browser:
        form = {"stage": "negotiation", "amount": "777", "close_date": "2030-01-01"}
        saved = browser.post(f"/deals/{deal}/edit", data=form, follow_redirects=True)
        assert saved.status_code == 200 and "$777" in saved.text
    with httpx.Client(base_url=two.origin, cookies={COOKIE: two.token}) as other:
        assert "$777" not in other.get(f"/deals/{deal}").text
    with one.lock:  # the env's side: reads under the session's lock
        assert [c["id"] for c in diff(one.conn)] == [deal]
    assert diff(two.conn) == []
    assert (one.requests, two.requests) == (2, 1)
    assert httpx.get(one.url("/deals")).status_code == 403
    server.close_session(one.token)
    assert httpx.get(one.url("/deals"), cookies={COOKIE: one.token}).status_code == 403
    assert server.session(two.token) is two


def test_the_shared_server_is_one_per_process():
    assert shared_server() is shared_server()
