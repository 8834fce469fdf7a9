"""The pages of web-crm-v1 that change deals and tickets: edit a deal, create a deal or a
ticket, and close a ticket behind a confirmation page (activities and emails: `outreach`).

Every write is one `CrmApi` call on the episode's connection, with the API's validation
and the rows it changes, so the database diff after a task done in the browser is the one
crm-v1's tools would leave. A refusal (the API's `ToolError`, or a value that does not
parse) re-renders the form with status 422, the reason as an alert and the values kept;
a success redirects (303) to the record's page with a flash message. The deal form
passes `CrmApi.update_deal` only the fields the user changed, as a person editing one
field means (an untouched past close date is not re-submitted).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form
from fastapi.responses import Response

from rldojo.envs.crm.api import CrmApi
from rldojo.envs.crm.data import OPEN_STAGES, PRIORITIES, STAGES
from rldojo.envs.tools import ToolError
from rldojo.envs.web_crm.episode import Episode, Row, current_episode, record
from rldojo.envs.web_crm.forms import (
    DATE,
    FormError,
    area,
    cancel,
    choices,
    form,
    optional,
    parse_amount,
    pick,
    related,
    select,
    text,
)
from rldojo.envs.web_crm.pages import esc

__all__ = ["router"]

router = APIRouter()


# ------------------------------------------------------------------ edit a deal


def _deal_form(ep: Episode, d: Row, values: dict[str, str], error: str | None = None) -> Response:
    parts = [
        select("stage", "Stage", choices(STAGES), values["stage"]),
        text("amount", "Amount (USD)", values["amount"]),
        text("close_date", "Close date", values["close_date"], DATE),
    ]
    body = form(f"/deals/{d['id']}/edit", parts, "Save deal", error) + cancel(f"/deals/{d['id']}")
    return ep.form_page(f"Edit deal {d['id']}: {d['name']}", body, error)


def _deal_changes(d: Row, values: dict[str, str]) -> dict[str, str | int]:
    """The fields whose submitted value differs from the deal's."""
    submitted: dict[str, str | int] = {
        "stage": pick(values["stage"], STAGES, "stage"),
        "amount": parse_amount(values["amount"]),
        "close_date": values["close_date"].strip(),
    }
    return {k: v for k, v in submitted.items() if v != d[k]}


@router.get("/deals/{deal_id}/edit")
def edit_deal_form(deal_id: str, ep: Episode = Depends(current_episode)) -> Response:
    with ep.lock:
        d = record(ep.conn, "deals", deal_id, "Deal")
        values = {"stage": d["stage"], "amount": str(d["amount"]), "close_date": d["close_date"]}
        return _deal_form(ep, d, values)


@router.post("/deals/{deal_id}/edit")
def edit_deal(
    deal_id: str,
    stage: str = Form(""),
    amount: str = Form(""),
    close_date: str = Form(""),
    ep: Episode = Depends(current_episode),
) -> Response:
    values = {"stage": stage, "amount": amount, "close_date": close_date}
    with ep.lock:
        d = record(ep.conn, "deals", deal_id, "Deal")
        try:
            CrmApi(ep.conn).update_deal(d["id"], **_deal_changes(d, values))  # type: ignore[arg-type]
        except (FormError, ToolError) as exc:
            return _deal_form(ep, d, values, str(exc))
        return ep.redirect(f"/deals/{d['id']}", f"Deal {d['id']} saved.")


# ------------------------------------------------------------------ create a deal


def _new_deal_form(
    ep: Episode, acc: Row, values: dict[str, str], error: str | None = None
) -> Response:
    parts = [
        text("name", "Deal name", values["name"]),
        text("amount", "Amount (USD)", values["amount"]),
        select("stage", "Stage", choices(OPEN_STAGES), values["stage"]),
        text("close_date", "Close date (optional)", values["close_date"], DATE),
    ]
    action = f"/accounts/{acc['id']}/deals/new"
    body = form(action, parts, "Create deal", error) + cancel(f"/accounts/{acc['id']}")
    return ep.form_page(f"New deal for {acc['name']} ({acc['id']})", body, error)


@router.get("/accounts/{acc_id}/deals/new")
def new_deal_form(acc_id: str, ep: Episode = Depends(current_episode)) -> Response:
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        values = {"name": "", "amount": "", "stage": "prospecting", "close_date": ""}
        return _new_deal_form(ep, acc, values)


@router.post("/accounts/{acc_id}/deals/new")
def new_deal(
    acc_id: str,
    name: str = Form(""),
    amount: str = Form(""),
    stage: str = Form("prospecting"),
    close_date: str = Form(""),
    ep: Episode = Depends(current_episode),
) -> Response:
    values = {"name": name, "amount": amount, "stage": stage, "close_date": close_date}
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        try:
            deal = CrmApi(ep.conn).create_deal(
                acc["id"],
                name,
                parse_amount(amount),
                pick(stage, OPEN_STAGES, "stage"),  # type: ignore[arg-type]
                optional(close_date),
            )
        except (FormError, ToolError) as exc:
            return _new_deal_form(ep, acc, values, str(exc))
        return ep.redirect(f"/deals/{deal['id']}", f"Deal {deal['id']} created.")


# ------------------------------------------------------------------ create a ticket


def _ticket_form(
    ep: Episode, acc: Row, values: dict[str, str], error: str | None = None
) -> Response:
    parts = [
        text("subject", "Subject", values["subject"]),
        area("description", "Description", values["description"]),
        select("priority", "Priority", choices(PRIORITIES), values["priority"]),
        select(
            "contact_id", "Contact", related(ep.conn, "contacts", acc["id"]), values["contact_id"]
        ),
    ]
    action = f"/accounts/{acc['id']}/tickets/new"
    body = form(action, parts, "Create ticket", error) + cancel(f"/accounts/{acc['id']}")
    return ep.form_page(f"New ticket for {acc['name']} ({acc['id']})", body, error)


@router.get("/accounts/{acc_id}/tickets/new")
def new_ticket_form(acc_id: str, ep: Episode = Depends(current_episode)) -> Response:
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        values = {"subject": "", "description": "", "priority": "medium", "contact_id": ""}
        return _ticket_form(ep, acc, values)


@router.post("/accounts/{acc_id}/tickets/new")
def new_ticket(
    acc_id: str,
    subject: str = Form(""),
    description: str = Form(""),
    priority: str = Form("medium"),
    contact_id: str = Form(""),
    ep: Episode = Depends(current_episode),
) -> Response:
    values = {"subject": subject, "description": description, "priority": priority}
    values["contact_id"] = contact_id
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        try:
            ticket = CrmApi(ep.conn).create_ticket(
                acc["id"],
                subject,
                description,
                pick(priority, PRIORITIES, "priority"),  # type: ignore[arg-type]
                optional(contact_id),
            )
        except (FormError, ToolError) as exc:
            return _ticket_form(ep, acc, values, str(exc))
        return ep.redirect(f"/tickets/{ticket['id']}", f"Ticket {ticket['id']} created.")


# ------------------------------------------------------------------ close a ticket


def _close_form(ep: Episode, t: Row, resolution: str, error: str | None = None) -> Response:
    parts = [area("resolution", "Resolution", resolution)]
    body = form(f"/tickets/{t['id']}/close", parts, "Close ticket", error)
    body += cancel(f"/tickets/{t['id']}")
    return ep.form_page(f"Close ticket {t['id']}: {t['subject']}", body, error)


@router.get("/tickets/{tck_id}/close")
def close_ticket_form(tck_id: str, ep: Episode = Depends(current_episode)) -> Response:
    with ep.lock:
        return _close_form(ep, record(ep.conn, "tickets", tck_id, "Ticket"), "")


@router.post("/tickets/{tck_id}/close")
def close_ticket_confirm(
    tck_id: str, resolution: str = Form(""), ep: Episode = Depends(current_episode)
) -> Response:
    """The confirmation page: nothing changes until "Confirm" is pressed."""
    with ep.lock:
        t = record(ep.conn, "tickets", tck_id, "Ticket")
        body = (
            f"<p>Close ticket {esc(t['id'])} ({esc(t['subject'])}) with the resolution "
            f"&quot;{esc(resolution)}&quot;?</p>"
            f'<form method="post" action="/tickets/{esc(t["id"])}/close/confirm">'
            f'<input type="hidden" name="resolution" value="{esc(resolution)}">'
            '<button type="submit">Confirm</button></form>'
            f'<form method="get" action="/tickets/{esc(t["id"])}">'
            '<button type="submit">Cancel</button></form>'
        )
        return ep.page(f"Close ticket {t['id']}?", body)


@router.post("/tickets/{tck_id}/close/confirm")
def close_ticket(
    tck_id: str, resolution: str = Form(""), ep: Episode = Depends(current_episode)
) -> Response:
    with ep.lock:
        t = record(ep.conn, "tickets", tck_id, "Ticket")
        try:
            CrmApi(ep.conn).close_ticket(t["id"], resolution)
        except ToolError as exc:
            return _close_form(ep, t, resolution, str(exc))
        return ep.redirect(f"/tickets/{t['id']}", f"Ticket {t['id']} closed.")
