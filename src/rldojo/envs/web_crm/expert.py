"""The web-crm-v1 expert: a scripted agent per task template, playing through the browser.

Each template has a script that searches, pages through lists, follows links, fills
forms and confirms, with every id, ref and value read from the page text
(`rldojo.envs.web_crm.reading`), never from the scenario's expectations; names,
subjects, amounts and dates come from the request. One turn is one action, or the
actions on one form (type, select, then the button), whose refs stay valid until the
page changes. Where a form refuses what the user said (a close date in words), the
script reads the alert and types the date again as the form wants it, which is the
recovery the demonstrations teach.

A script is a generator: it yields the actions of a turn and receives the text the
environment answered (the page, or the first error); its return value is the answer.
The expert is stateless: each `act` replays the script over the replies already in the
conversation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from datetime import datetime
from typing import Any

from rldojo.envs.crm.data import OPEN_STAGES, TODAY
from rldojo.envs.experts import ScriptedExpert
from rldojo.envs.web_crm.reading import NotOnPage, alert, cell_ref, cell_text, field, ref, table
from rldojo.types import Message

__all__ = ["SCRIPTS", "WebCrmExpert", "make_expert"]

Action = tuple[str, dict[str, Any]]
Script = Generator[list[Action], str, str]
Steps = Generator[list[Action], str, Any]


def _parse(pattern: str, prompt: str) -> tuple[str, ...]:
    match = re.search(pattern, prompt)
    if match is None:
        raise NotOnPage("I could not understand the request.")
    return match.groups()


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def _act(actions: list[Action]) -> Steps:
    """Run a turn's actions; the page after them (an action's error ends the script)."""
    page = yield actions
    if page.startswith("error:"):
        raise NotOnPage(f"The application refused an action: {page.splitlines()[0][7:]}")
    return page


def _click(page: str, role: str, name: str) -> Steps:
    return (yield from _act([("click", {"ref": ref(page, role, name)})]))


def _find(kind: str, query: str, title: str, test: Callable[[dict[str, str]], bool]) -> Steps:
    """Search a list page for `query` and page through the results to the row that passes
    `test`; (page, row)."""
    page = yield from _act([("goto", {"path": f"/{kind}"})])
    search = [("type", {"ref": ref(page, "textbox", "Search"), "text": query})]
    page = yield from _act([*search, ("click", {"ref": ref(page, "button", "Search")})])
    while True:
        for row in table(page, title):
            if test(row):
                return page, row
        if '] link "Next"' not in page:
            raise NotOnPage(f'I could not find "{query}" in the {kind} list.')
        page = yield from _click(page, "link", "Next")


def _account(name: str) -> Steps:
    """The account's page, found through the accounts list."""
    _, row = yield from _find(
        "accounts", name, "Accounts", lambda r: _same(cell_text(r["Name"]), name)
    )
    return (yield from _act([("click", {"ref": cell_ref(row["Name"])})]))


def _deal(account: str, deal: str) -> Steps:
    """The deal's page, found through the deals list (its name and account)."""

    def test(r: dict[str, str]) -> bool:
        return _same(cell_text(r["Name"]), deal) and _same(r["Account"], account)

    _, row = yield from _find("deals", deal, "Deals", test)
    return (yield from _act([("click", {"ref": cell_ref(row["Name"])})]))


Field = tuple[str, str, str]
"""A form field to fill: (``type`` or ``select``, its label, the value)."""


def _submit(page: str, button: str, fields: list[Field], *, refusal_ok: bool = False) -> Steps:
    """Fill a form and press `button`; the page after it. A refused form (an alert) ends
    the script, unless `refusal_ok` (the caller reads the alert)."""
    actions: list[Action] = []
    for action, label, value in fields:
        role, key = ("textbox", "text") if action == "type" else ("combobox", "option")
        actions.append((action, {"ref": ref(page, role, label), key: value}))
    page = yield from _act([*actions, ("click", {"ref": ref(page, "button", button)})])
    if alert(page) and not refusal_ok:
        raise NotOnPage(f"The application refused it: {alert(page)}")
    return page


def _edit_deal(page: str, fields: list[Field]) -> Steps:
    page = yield from _click(page, "link", "Edit deal")
    return (yield from _submit(page, "Save deal", fields))


def _close_ticket_here(page: str, resolution: str) -> Steps:
    """Close the ticket whose page this is: the form, then its confirmation."""
    page = yield from _click(page, "link", "Close ticket")
    page = yield from _submit(page, "Close ticket", [("type", "Resolution", resolution)])
    return (yield from _click(page, "button", "Confirm"))


def _amount(text: str) -> int:
    return int(text.replace("$", "").replace(",", ""))


def _label(stage: str) -> str:
    return stage.replace("_", " ")


# ------------------------------------------------------------------ level 1: look up


def _contact_email(prompt: str) -> Script:
    name, account = _parse(r"email address of (.+) at (.+)\?$", prompt)
    page = yield from _account(account)
    rows = [r for r in table(page, "Contacts") if _same(cell_text(r["Name"]), name)]
    if not rows:
        raise NotOnPage(f"{account} has no contact named {name}.")
    return f"The email address of {name} is {rows[0]['Email']}."


def _deal_stage(prompt: str) -> Script:
    account, deal = _parse(r'Which stage is the (.+) deal "(.+)" in\?$', prompt)
    page = yield from _deal(account, deal)
    return f'The deal "{deal}" is in the {_label(field(page, "Stage"))} stage.'


def _account_owner(prompt: str) -> Script:
    (account,) = _parse(r"account owner of (.+)\?$", prompt)
    page = yield from _account(account)
    return f"The account owner of {account} is {field(page, 'Owner')}."


def _open_tickets(prompt: str) -> Script:
    (account,) = _parse(r"support tickets of (.+) are not closed", prompt)
    page = yield from _account(account)
    n = sum(r["Status"] != "closed" for r in table(page, "Tickets"))
    return f"{account} has {n} tickets that are not closed."


# ------------------------------------------------------------------ level 2: edit forms


def _move_stage(prompt: str) -> Script:
    account, deal, label = _parse(r'Move the (.+) deal "(.+)" to the (.+) stage\.$', prompt)
    page = yield from _deal(account, deal)
    yield from _edit_deal(page, [("select", "Stage", label)])
    return f'I moved "{deal}" to the {label} stage.'


def _close_ticket(prompt: str) -> Script:
    ticket, _, resolution = _parse(
        r'Close ticket (\S+) \("(.*)"\) with the resolution "(.+)"\.$', prompt
    )
    _, row = yield from _find("tickets", ticket, "Tickets", lambda r: r["ID"] == ticket)
    page = yield from _act([("click", {"ref": cell_ref(row["Subject"])})])
    yield from _close_ticket_here(page, resolution)
    return f"I closed ticket {ticket}."


def _conditional_stage(prompt: str) -> Script:
    account, deal = _parse(r'Check the (.+) deal "(.+)": if its amount', prompt)
    page = yield from _deal(account, deal)
    target = "negotiation" if _amount(field(page, "Amount")) >= 50_000 else "proposal"
    yield from _edit_deal(page, [("select", "Stage", target)])
    return f'I moved "{deal}" to the {target} stage.'


# ------------------------------------------------------------------ level 3: create forms


def _deal_and_note_in_words(prompt: str) -> Script:
    name, account, amount, when, subject = _parse(
        r'deal named "(.+)" for (.+) worth \$([\d,]+) closing on (.+), then log a note on '
        r'that deal with the subject "(.+)"\.$',
        prompt,
    )
    page = yield from _account(account)
    page = yield from _click(page, "link", "New deal")
    deal = [("Deal name", name), ("Amount (USD)", amount), ("Close date (optional)", when)]
    fields = [("type", label, value) for label, value in deal]
    page = yield from _submit(page, "Create deal", fields, refusal_ok=True)
    if alert(page):  # the date as the user said it: typed again as the form asks
        iso = datetime.strptime(when, "%B %d, %Y").date().isoformat()
        page = yield from _submit(page, "Create deal", [("type", "Close date (optional)", iso)])
    page = yield from _click(page, "link", "Log activity")
    yield from _submit(
        page, "Log activity", [("select", "Type", "note"), ("type", "Subject", subject)]
    )
    return f'I created the deal "{name}" and logged the note on it.'


def _create_ticket(prompt: str) -> Script:
    priority, account, subject = _parse(
        r'Open an? (\w+) priority support ticket for (.+) with the subject "(.+)"\.$', prompt
    )
    page = yield from _account(account)
    page = yield from _click(page, "link", "New ticket")
    fields = [("type", "Subject", subject), ("select", "Priority", priority)]
    page = yield from _submit(page, "Create ticket", fields)
    return f"I opened ticket {field(page, 'ID')} for {account}."


def _log_call(prompt: str) -> Script:
    name, account, subject = _parse(
        r'Log a call with (.+?) of (.+), with the subject "(.+)"\.$', prompt
    )
    page = yield from _account(account)
    rows = [r for r in table(page, "Contacts") if _same(cell_text(r["Name"]), name)]
    if not rows:
        raise NotOnPage(f"{account} has no contact named {name}.")
    page = yield from _act([("click", {"ref": cell_ref(rows[0]["Name"])})])
    page = yield from _click(page, "link", "Log activity")
    yield from _submit(
        page, "Log activity", [("select", "Type", "call"), ("type", "Subject", subject)]
    )
    return f"I logged the call with {name}."


# ------------------------------------------------------------------ level 4: several records


def _close_urgent(prompt: str) -> Script:
    account, resolution = _parse(
        r'Close every ticket of (.+) that is not closed .* with the resolution "(.+)"\.', prompt
    )
    page = yield from _account(account)
    hot = [
        r["ID"]
        for r in table(page, "Tickets")
        if r["Status"] != "closed" and r["Priority"] in ("high", "urgent")
    ]
    for i, ticket in enumerate(hot):
        (row,) = [r for r in table(page, "Tickets") if r["ID"] == ticket]
        page = yield from _act([("click", {"ref": cell_ref(row["Subject"])})])
        page = yield from _close_ticket_here(page, resolution)
        if i < len(hot) - 1:
            page = yield from _click(page, "link", account)
    return f"I closed {len(hot)} tickets: {', '.join(hot)}."


def _overdue_lost(prompt: str) -> Script:
    (account,) = _parse(r"Mark every open deal of (.+) whose close date", prompt)
    page = yield from _account(account)
    overdue = [
        r["ID"]
        for r in table(page, "Deals")
        if _stage(r["Stage"]) in OPEN_STAGES and r["Close date"] < TODAY.isoformat()
    ]
    if not overdue:
        return f"{account} has no open deals past their close date; I changed nothing."
    for i, deal in enumerate(overdue):
        (row,) = [r for r in table(page, "Deals") if r["ID"] == deal]
        page = yield from _act([("click", {"ref": cell_ref(row["Name"])})])
        page = yield from _edit_deal(page, [("select", "Stage", "closed lost")])
        if i < len(overdue) - 1:
            page = yield from _click(page, "link", account)
    return f"I marked {len(overdue)} overdue deals closed lost: {', '.join(overdue)}."


def _win_and_thank(prompt: str) -> Script:
    account, deal, amount, name = _parse(
        r'We won the (.+) deal "(.+)" at \$([\d,]+)\. .* and email (.+), the primary', prompt
    )
    page = yield from _deal(account, deal)
    won = [("select", "Stage", "closed won"), ("type", "Amount (USD)", str(_amount(amount)))]
    page = yield from _edit_deal(page, won)
    page = yield from _click(page, "link", account)
    rows = [r for r in table(page, "Contacts") if _same(cell_text(r["Name"]), name)]
    if not rows:
        raise NotOnPage(f"{account} has no contact named {name}.")
    page = yield from _act([("click", {"ref": cell_ref(rows[0]["Name"])})])
    if field(page, "Opted out of email") == "yes":
        return f'I marked "{deal}" closed won; {name} opted out of email, so I did not email them.'
    page = yield from _click(page, "link", "Send email")
    thanks = f"Thank you for choosing us for {deal}. We look forward to working with you."
    fields = [("type", "Subject", f"Thank you: {deal}"), ("type", "Message", thanks)]
    yield from _submit(page, "Send email", fields)
    return f'I marked "{deal}" closed won at ${amount} and emailed {name}.'


def _stage(label: str) -> str:
    return label.strip().replace(" ", "_")


SCRIPTS: dict[str, Callable[[str], Script]] = {
    "contact_email": _contact_email,
    "deal_stage": _deal_stage,
    "account_owner": _account_owner,
    "open_tickets": _open_tickets,
    "move_stage": _move_stage,
    "close_ticket": _close_ticket,
    "conditional_stage": _conditional_stage,
    "deal_and_note_in_words": _deal_and_note_in_words,
    "create_ticket": _create_ticket,
    "log_call": _log_call,
    "close_urgent": _close_urgent,
    "overdue_lost": _overdue_lost,
    "win_and_thank": _win_and_thank,
}
"""The script of each template, by the template's name (``task.info["template"]``)."""


def replies(messages: list[Message]) -> list[str]:
    """What the environment answered to each assistant turn so far: the first error of the
    turn, else its last tool reply (the page)."""
    out: list[str] = []
    turn: list[str] | None = None
    for m in messages:
        if m["role"] == "assistant":
            if turn is not None:
                out.append(_reply(turn))
            turn = []
        elif m["role"] == "tool" and turn is not None:
            turn.append(
                m["content"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
            )
    if turn is not None:
        out.append(_reply(turn))
    return out


def _reply(turn: list[str]) -> str:
    errors = [t for t in turn if t.startswith("error:")]
    return errors[0] if errors else (turn[-1] if turn else "error: no reply")


class WebCrmExpert(ScriptedExpert):
    """Plays web-crm-v1 by the script of the task's template (see the module docstring)."""

    scripts = SCRIPTS
    stop = NotOnPage

    def replies(self, messages: list[Message]) -> list[str]:
        return replies(messages)


def make_expert(**_env_kwargs: object) -> WebCrmExpert:
    """The web-crm-v1 expert (the same for every configuration of the env)."""
    return WebCrmExpert()
