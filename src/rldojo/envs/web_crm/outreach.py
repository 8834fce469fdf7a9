"""The pages of web-crm-v1 that record contact with a customer: log an activity on an
account (optionally its contact and deal) and email a contact.

As in `rldojo.envs.web_crm.actions`: one `CrmApi` call per submission, a refusal comes
back as the form with an alert (status 422) and the values kept, a success redirects
(303) with a flash message. The activity form can start with a contact or deal chosen
(``?contact_id=CON-0003&deal_id=DEAL-0012``, the links on their pages).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form
from fastapi.responses import Response

from rldojo.envs.crm.api import CrmApi
from rldojo.envs.crm.data import ACTIVITY_TYPES
from rldojo.envs.tools import ToolError
from rldojo.envs.web_crm.episode import Episode, Row, current_episode, record
from rldojo.envs.web_crm.forms import (
    FormError,
    area,
    cancel,
    choices,
    form,
    optional,
    pick,
    related,
    select,
    text,
)
from rldojo.envs.web_crm.pages import esc

__all__ = ["router"]

router = APIRouter()


# ------------------------------------------------------------------ log an activity


def _activity_form(
    ep: Episode, acc: Row, values: dict[str, str], error: str | None = None
) -> Response:
    parts = [
        select("type", "Type", choices(ACTIVITY_TYPES), values["type"]),
        text("subject", "Subject", values["subject"]),
        area("notes", "Notes", values["notes"]),
        select(
            "contact_id", "Contact", related(ep.conn, "contacts", acc["id"]), values["contact_id"]
        ),
        select("deal_id", "Deal", related(ep.conn, "deals", acc["id"]), values["deal_id"]),
    ]
    action = f"/accounts/{acc['id']}/activities/new"
    body = form(action, parts, "Log activity", error) + cancel(f"/accounts/{acc['id']}")
    title = f"Log activity for {acc['name']} ({acc['id']})"
    return ep.form_page(title, body, error)


@router.get("/accounts/{acc_id}/activities/new")
def new_activity_form(
    acc_id: str, contact_id: str = "", deal_id: str = "", ep: Episode = Depends(current_episode)
) -> Response:
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        values = {"type": "call", "subject": "", "notes": ""}
        values |= {"contact_id": contact_id, "deal_id": deal_id}
        return _activity_form(ep, acc, values)


@router.post("/accounts/{acc_id}/activities/new")
def new_activity(
    acc_id: str,
    type: str = Form("call"),
    subject: str = Form(""),
    notes: str = Form(""),
    contact_id: str = Form(""),
    deal_id: str = Form(""),
    ep: Episode = Depends(current_episode),
) -> Response:
    values = {"type": type, "subject": subject, "notes": notes}
    values |= {"contact_id": contact_id, "deal_id": deal_id}
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        try:
            row = CrmApi(ep.conn).log_activity(
                acc["id"],
                pick(type, ACTIVITY_TYPES, "type"),  # type: ignore[arg-type]
                subject,
                notes,
                optional(contact_id),
                optional(deal_id),
            )
        except (FormError, ToolError) as exc:
            return _activity_form(ep, acc, values, str(exc))
        return ep.redirect(f"/accounts/{acc['id']}", f"Activity {row['id']} logged.")


# ------------------------------------------------------------------ email a contact


def _email_form(ep: Episode, c: Row, values: dict[str, str], error: str | None = None) -> Response:
    acc_id = c["account_id"]
    parts = [
        text("subject", "Subject", values["subject"]),
        area("body", "Message", values["body"]),
        select("deal_id", "About deal", related(ep.conn, "deals", acc_id), values["deal_id"]),
        select(
            "ticket_id", "About ticket", related(ep.conn, "tickets", acc_id), values["ticket_id"]
        ),
    ]
    to = f"<p>To: {esc(c['first_name'])} {esc(c['last_name'])} &lt;{esc(c['email'])}&gt;"
    to += " (opted out of email)</p>" if c["do_not_email"] else "</p>"
    body = to + form(f"/contacts/{c['id']}/email", parts, "Send email", error)
    body += cancel(f"/contacts/{c['id']}")
    return ep.form_page(f"Email contact {c['id']}", body, error)


@router.get("/contacts/{con_id}/email")
def email_form(con_id: str, ep: Episode = Depends(current_episode)) -> Response:
    with ep.lock:
        c = record(ep.conn, "contacts", con_id, "Contact")
        values = {"subject": "", "body": "", "deal_id": "", "ticket_id": ""}
        return _email_form(ep, c, values)


@router.post("/contacts/{con_id}/email")
def send_email(
    con_id: str,
    subject: str = Form(""),
    body: str = Form(""),
    deal_id: str = Form(""),
    ticket_id: str = Form(""),
    ep: Episode = Depends(current_episode),
) -> Response:
    values = {"subject": subject, "body": body, "deal_id": deal_id, "ticket_id": ticket_id}
    with ep.lock:
        c = record(ep.conn, "contacts", con_id, "Contact")
        try:
            sent = CrmApi(ep.conn).send_email(
                c["id"], subject, body, optional(deal_id), optional(ticket_id)
            )
        except ToolError as exc:
            return _email_form(ep, c, values, str(exc))
        return ep.redirect(f"/contacts/{c['id']}", f"Email {sent['id']} sent to {sent['to']}.")
