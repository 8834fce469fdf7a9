"""The crm-v1 expert: a scripted agent per scenario template (`rldojo.envs.crm.scenarios`).

Each template has a script that looks entities up with the search tools, reads ids and
values from the tool results, makes the write calls and ends with a short ``<answer>``
stating the facts asked for. Names, subjects, amounts and resolutions come from the
request text (what the user said); ids, stages, emails, tiers and amounts on record come
from the tool results, never from the scenario's expectations. One turn is one call, or
a few independent calls (``search_deals`` and ``search_contacts`` of one account, the
closes of several tickets), so every level fits the six turns of
``examples/agentic_crm.toml``.

A script is a generator: it yields the calls of a turn and receives their
`ToolExchange`s; its return value is the answer. The expert is stateless: each `act`
replays the script over the exchanges already in the conversation (`tool_exchanges`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from typing import Any

from rldojo.envs.crm.data import OPEN_STAGES, TODAY
from rldojo.envs.experts import ScriptedExpert, ToolExchange, tool_exchanges
from rldojo.types import Message

__all__ = ["SCRIPTS", "CrmExpert", "make_expert"]

Call = tuple[str, dict[str, Any]]
Script = Generator[list[Call], list[ToolExchange], str]


class _Stop(Exception):
    """The script cannot go on (nothing found, a refused write): answer with the reason."""


def _parse(pattern: str, prompt: str) -> tuple[str, ...]:
    match = re.search(pattern, prompt)
    if match is None:
        raise _Stop("I could not understand the request.")
    return match.groups()


def _result(exchange: ToolExchange) -> Any:
    if not exchange.ok:
        raise _Stop(f"{exchange.name} failed: {exchange.error}")
    return exchange.result


def _pick(exchange: ToolExchange, what: str, test: Callable[[dict[str, Any]], bool]) -> dict:
    rows = _result(exchange)
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and test(row):
            return row
    raise _Stop(f"I could not find {what}.")


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _account(name: str) -> Generator[list[Call], list[ToolExchange], dict]:
    (found,) = yield [("search_accounts", {"query": name})]
    return _pick(found, f"the account {name}", lambda r: _same(r["name"], name))


def _deal_of(exchange: ToolExchange, name: str) -> dict:
    return _pick(exchange, f'the deal "{name}"', lambda r: _same(r["name"], name))


def _contact_of(exchange: ToolExchange, name: str) -> dict:
    return _pick(exchange, name, lambda r: _same(f"{r['first_name']} {r['last_name']}", name))


def _deal(account: str, deal: str) -> Generator[list[Call], list[ToolExchange], tuple[dict, dict]]:
    acc = yield from _account(account)
    (found,) = yield [("search_deals", {"query": deal, "account_id": acc["id"]})]
    return acc, _deal_of(found, deal)


def _writes(calls: list[Call]) -> Generator[list[Call], list[ToolExchange], list[Any]]:
    done = yield calls
    return [_result(x) for x in done]


def _amount(text: str) -> int:
    return int(text.replace(",", ""))


def _stage(label: str) -> str:
    return label.strip().replace(" ", "_")


def _label(stage: str) -> str:
    return stage.replace("_", " ")


# ------------------------------------------------------------------ level 1: lookups


def _contact_email(prompt: str) -> Script:
    name, account = _parse(r"email address of (.+) at (.+)\?$", prompt)
    acc = yield from _account(account)
    (found,) = yield [("search_contacts", {"query": name, "account_id": acc["id"]})]
    return f"The email address of {name} is {_contact_of(found, name)['email']}."


def _deal_stage(prompt: str) -> Script:
    account, deal = _parse(r'Which stage is the (.+) deal "(.+)" in\?$', prompt)
    _, row = yield from _deal(account, deal)
    return f'The deal "{deal}" is in the {_label(row["stage"])} stage.'


def _account_owner(prompt: str) -> Script:
    (account,) = _parse(r"account owner of (.+)\?$", prompt)
    acc = yield from _account(account)
    return f"The account owner of {account} is {acc['owner']}."


def _open_tickets(prompt: str) -> Script:
    (account,) = _parse(r"support tickets of (.+) are not closed", prompt)
    acc = yield from _account(account)
    (found,) = yield [("get_account", {"account_id": acc["id"]})]
    return f"{account} has {_result(found)['open_tickets']} tickets that are not closed."


# ------------------------------------------------------------------ level 2: one update


def _move_stage(prompt: str) -> Script:
    account, deal, label = _parse(r'Move the (.+) deal "(.+)" to the (.+) stage\.$', prompt)
    _, row = yield from _deal(account, deal)
    yield from _writes([("update_deal", {"deal_id": row["id"], "stage": _stage(label)})])
    return f'I moved "{deal}" to the {label} stage.'


def _close_ticket(prompt: str) -> Script:
    ticket, _, resolution = _parse(
        r'Close ticket (\S+) \("(.*)"\) with the resolution "(.+)"\.$', prompt
    )
    yield from _writes([("close_ticket", {"ticket_id": ticket, "resolution": resolution})])
    return f"I closed ticket {ticket}."


def _log_call(prompt: str) -> Script:
    name, account, subject = _parse(
        r'Log a call with (.+?) of (.+), with the subject "(.+)"\.$', prompt
    )
    acc = yield from _account(account)
    (found,) = yield [("search_contacts", {"query": name, "account_id": acc["id"]})]
    contact = _contact_of(found, name)
    args = {
        "account_id": acc["id"],
        "type": "call",
        "subject": subject,
        "contact_id": contact["id"],
    }
    yield from _writes([("log_activity", args)])
    return f"I logged the call with {name}."


def _create_ticket(prompt: str) -> Script:
    priority, account, subject = _parse(
        r'Open an? (\w+) priority support ticket for (.+) with the subject "(.+)"\.$', prompt
    )
    acc = yield from _account(account)
    args = {"account_id": acc["id"], "subject": subject, "priority": priority}
    (ticket,) = yield from _writes([("create_ticket", args)])
    return f"I opened ticket {ticket['id']} for {account}."


# ------------------------------------------------------------------ level 3: several updates


def _win_and_thank(prompt: str) -> Script:
    account, deal, amount, name = _parse(
        r'We won the (.+) deal "(.+)" at \$([\d,]+)\. .* and email (.+), the primary', prompt
    )
    acc = yield from _account(account)
    deals, contacts = yield [
        ("search_deals", {"query": deal, "account_id": acc["id"]}),
        ("search_contacts", {"query": name, "account_id": acc["id"]}),
    ]
    row, contact = _deal_of(deals, deal), _contact_of(contacts, name)
    update = {"deal_id": row["id"], "stage": "closed_won", "amount": _amount(amount)}
    if contact.get("do_not_email"):
        yield from _writes([("update_deal", update)])
        return f'I marked "{deal}" closed won; {name} opted out of email, so I did not email them.'
    email = {
        "contact_id": contact["id"],
        "subject": f"Thank you: {deal}",
        "body": f"Thank you for choosing us for {deal}. We look forward to working with you.",
        "deal_id": row["id"],
    }
    yield from _writes([("update_deal", update), ("send_email", email)])
    return f'I marked "{deal}" closed won at ${amount} and emailed {name}.'


def _close_urgent(prompt: str) -> Script:
    account, resolution = _parse(
        r'Close every ticket of (.+) that is not closed .*, with the resolution "(.+)"\.', prompt
    )
    acc = yield from _account(account)
    (found,) = yield [("search_tickets", {"account_id": acc["id"], "limit": 50})]
    hot = [
        t["id"]
        for t in _result(found)
        if t["status"] != "closed" and t["priority"] in ("high", "urgent")
    ]
    if not hot:
        return f"{account} has no open high or urgent tickets, so I closed 0 tickets."
    yield from _writes([("close_ticket", {"ticket_id": t, "resolution": resolution}) for t in hot])
    return f"I closed {len(hot)} tickets: {', '.join(hot)}."


def _deal_and_note(prompt: str) -> Script:
    deal, account, amount, close, subject = _parse(
        r'Create a deal named "(.+)" for (.+) worth \$([\d,]+) with close date (\S+), '
        r'then log a note on that deal with the subject "(.+)"\.$',
        prompt,
    )
    acc = yield from _account(account)
    args = {"account_id": acc["id"], "name": deal, "amount": _amount(amount), "close_date": close}
    (row,) = yield from _writes([("create_deal", args)])
    note = {"account_id": acc["id"], "type": "note", "subject": subject, "deal_id": row["id"]}
    yield from _writes([("log_activity", note)])
    return f'I created the deal "{deal}" ({row["id"]}) and logged the note on it.'


# ------------------------------------------------------------------ level 4: conditions


def _conditional_stage(prompt: str) -> Script:
    account, deal = _parse(r'Check the (.+) deal "(.+)": if its amount', prompt)
    _, row = yield from _deal(account, deal)
    target = "negotiation" if row["amount"] >= 50_000 else "proposal"
    yield from _writes([("update_deal", {"deal_id": row["id"], "stage": target})])
    return f"The amount is ${row['amount']}, so I chose the {target} stage."


def _discount(prompt: str) -> Script:
    account, deal = _parse(r'to the (.+) deal "(.+)" \(see the knowledge base\)', prompt)
    kb, accounts = yield [
        ("search_kb", {"query": "discount policy"}),
        ("search_accounts", {"query": account}),
    ]
    acc = _pick(accounts, f"the account {account}", lambda r: _same(r["name"], account))
    text = " ".join(str(doc.get("text", "")) for doc in _result(kb))
    allowed = {tier: int(p) for p, tier in re.findall(r"(\d+)% for (\w+) accounts", text)}
    if acc["tier"] not in allowed:
        raise _Stop(f"the knowledge base gives no discount for {acc['tier']} accounts.")
    (found,) = yield [("search_deals", {"query": deal, "account_id": acc["id"]})]
    row = _deal_of(found, deal)
    new = row["amount"] * (100 - allowed[acc["tier"]]) // 100
    yield from _writes([("update_deal", {"deal_id": row["id"], "amount": new})])
    return (
        f"I applied the {allowed[acc['tier']]}% {acc['tier']} discount: the new amount is ${new}."
    )


def _overdue_lost(prompt: str) -> Script:
    (account,) = _parse(r"Mark every open deal of (.+) whose close date", prompt)
    acc = yield from _account(account)
    (found,) = yield [("search_deals", {"account_id": acc["id"], "limit": 50})]
    today = TODAY.isoformat()
    overdue = [
        d["id"] for d in _result(found) if d["stage"] in OPEN_STAGES and d["close_date"] < today
    ]
    if not overdue:
        return f"{account} has no open deals past their close date; I changed nothing."
    yield from _writes([("update_deal", {"deal_id": d, "stage": "closed_lost"}) for d in overdue])
    return f"I marked {len(overdue)} overdue deals closed lost: {', '.join(overdue)}."


SCRIPTS: dict[str, Callable[[str], Script]] = {
    "contact_email": _contact_email,
    "deal_stage": _deal_stage,
    "account_owner": _account_owner,
    "open_tickets": _open_tickets,
    "move_stage": _move_stage,
    "close_ticket": _close_ticket,
    "log_call": _log_call,
    "create_ticket": _create_ticket,
    "win_and_thank": _win_and_thank,
    "close_urgent": _close_urgent,
    "deal_and_note": _deal_and_note,
    "conditional_stage": _conditional_stage,
    "discount": _discount,
    "overdue_lost": _overdue_lost,
}
"""The script of each scenario template, by the template's name (``task.info["template"]``)."""


class CrmExpert(ScriptedExpert):
    """Plays crm-v1 by the script of the task's template (see the module docstring)."""

    scripts = SCRIPTS
    stop = _Stop

    def replies(self, messages: list[Message]) -> list[list[ToolExchange]]:
        return tool_exchanges(messages)


def make_expert(**_env_kwargs: object) -> CrmExpert:
    """The crm-v1 expert (the same for every configuration of the env)."""
    return CrmExpert()
