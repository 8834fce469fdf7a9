"""crm-v1: deterministic data, the API's validation errors, read-only SQL, search, tasks."""

from __future__ import annotations

import asyncio
import json

import pytest

from rldojo.envs.crm import CrmEnv
from rldojo.envs.crm.data import base_snapshot, build_database, diff, state_digest
from rldojo.envs.crm.scenarios import TEMPLATES
from rldojo.envs.registry import make_env


def run(coro):
    return asyncio.run(coro)


def call(tool: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def result(step) -> dict:
    """The JSON body of the first tool response of a step."""
    content = step.messages[0]["content"]
    return json.loads(content.removeprefix("<tool_response>").removesuffix("</tool_response>"))


@pytest.fixture(scope="module")
def env() -> CrmEnv:
    return make_env("crm-v1", db_size="small", n_databases=1, limits={"max_turns": 100})  # type: ignore[return-value]


@pytest.fixture
def live(env):
    run(env.reset(env.tasks("train", n=1)[0], seed=0))
    return env


def test_database_is_deterministic_per_seed():
    a, b = build_database(3, "small"), build_database(3, "small")
    assert a.serialize() == b.serialize()
    assert state_digest(a) == state_digest(b)
    assert state_digest(build_database(4, "small")) != state_digest(a)
    counts = {
        t: a.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t in ("accounts", "contacts", "deals", "tickets", "activities", "emails")
    }
    assert counts["accounts"] == 20 and counts["contacts"] >= 40 and counts["emails"] == 0
    assert base_snapshot(3, "small") == a.serialize()
    with pytest.raises(ValueError, match="db_size"):
        build_database(0, "huge")


def test_tasks_are_deterministic_and_cover_every_template():
    env = CrmEnv(db_size="small", n_databases=2)
    tasks = env.tasks("train", seed=1, n=120)
    assert [t.prompt for t in tasks] == [t.prompt for t in env.tasks("train", seed=1, n=120)]
    templates = {t.info["template"] for t in tasks}
    assert templates == {fn.__name__.lstrip("_") for fns in TEMPLATES.values() for fn in fns}
    test_dbs = {t.info["db"]["seed"] for t in env.tasks("test", n=10)}
    assert test_dbs.isdisjoint({t.info["db"]["seed"] for t in tasks})
    assert all(t.env == "crm-v1" and t.id.startswith("crm-v1/train/1/") for t in tasks)
    with pytest.raises(ValueError, match="levels"):
        CrmEnv(levels=[5])


def test_reads_and_realistic_validation_errors(live):
    deal = result(run(live.step(call("search_deals", stage="negotiation", limit=1))))["result"][0]
    got = result(run(live.step(call("get_deal", deal_id=deal["id"]))))["result"]
    assert got == deal
    errors = {
        "unknown id": (call("get_deal", deal_id="DEAL-9999"), "not found"),
        "bad id": (call("get_deal", deal_id="42"), "expected the form 'DEAL-0001'"),
        "past date": (call("update_deal", deal_id=deal["id"], close_date="2020-01-01"), "past"),
        "nothing": (call("update_deal", deal_id=deal["id"]), "nothing to update"),
        "amount": (call("update_deal", deal_id=deal["id"], amount=-5), "positive"),
        "bad stage": (call("update_deal", deal_id=deal["id"], stage="won"), "must be one of"),
        "limit": (call("search_accounts", limit=500), "between 1 and 50"),
    }
    for name, (action, message) in errors.items():
        body = result(run(live.step(action)))
        assert message in body["error"], (name, body)
    closed = result(run(live.step(call("search_deals", stage="closed_won", limit=1))))["result"][0]
    body = result(run(live.step(call("update_deal", deal_id=closed["id"], amount=1000))))
    assert "closed deals cannot be changed" in body["error"]
    assert diff(live.conn) == []  # refused requests changed nothing
    step = run(live.step("<answer>done</answer>"))
    assert step.info["tool/tool_error"] == 7 and step.info["tool/bad_arguments"] == 1


def test_writes_are_recorded_and_cross_account_ids_refused(live):
    accounts = result(run(live.step(call("search_accounts", limit=2))))["result"]
    a, b = accounts[0]["id"], accounts[1]["id"]
    other = result(run(live.step(call("search_contacts", account_id=b, limit=1))))["result"][0]
    body = result(
        run(
            live.step(
                call(
                    "log_activity", account_id=a, type="call", subject="Hi", contact_id=other["id"]
                )
            )
        )
    )
    assert f"belongs to account {b}, not {a}" in body["error"]
    made = result(run(live.step(call("create_deal", account_id=a, name="Big One", amount=5000))))
    assert made["result"]["stage"] == "prospecting"
    dup = result(run(live.step(call("create_deal", account_id=a, name="big one", amount=10))))
    assert "already has a deal" in dup["error"]
    ticket = result(
        run(live.step(call("create_ticket", account_id=a, subject="Broken", priority="high")))
    )
    tid = ticket["result"]["id"]
    result(run(live.step(call("close_ticket", ticket_id=tid, resolution="Fixed the bug"))))
    again = result(run(live.step(call("close_ticket", ticket_id=tid, resolution="Fixed it twice"))))
    assert "already closed" in again["error"]
    opted = live.conn.execute("SELECT id FROM contacts WHERE do_not_email = 1").fetchone()
    if opted:
        body = result(
            run(live.step(call("send_email", contact_id=opted[0], subject="Hi", body="x")))
        )
        assert "opted out" in body["error"]
    changes = {(c["table"], c["op"]) for c in diff(live.conn)}
    assert changes == {("deals", "insert"), ("tickets", "insert")}  # inserted then closed


def test_sql_tool_is_read_only(live):
    ok = result(run(live.step(call("sql", query="SELECT COUNT(*) AS n FROM accounts"))))
    assert ok["result"] == {"columns": ["n"], "rows": [[20]], "truncated": False}
    for query, message in [
        ("UPDATE deals SET amount = 1", "not authorized"),
        ("DELETE FROM accounts", "not authorized"),
        ("SELECT * FROM _changes", "prohibited"),
        ("PRAGMA table_info(deals)", "not authorized"),
        ("ATTACH DATABASE ':memory:' AS x", "not authorized"),
        ("SELECT 1; SELECT 2", "SQL error"),
        ("SELEC nonsense", "SQL error"),
    ]:
        body = result(run(live.step(call("sql", query=query))))
        assert message in body["error"], (query, body)
    big = result(run(live.step(call("sql", query="SELECT id FROM contacts"))))
    assert big["result"]["truncated"] and len(big["result"]["rows"]) == 50
    assert diff(live.conn) == []


def test_search_kb_finds_the_policy(live):
    found = result(run(live.step(call("search_kb", query="discount policy for gold accounts"))))
    assert found["result"][0]["id"] == "KB-1"
    empty = result(run(live.step(call("search_kb", query="!!!"))))
    assert "at least one word" in empty["error"]
