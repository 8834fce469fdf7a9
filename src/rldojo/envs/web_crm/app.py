"""The web application of web-crm-v1: `create_app` and the pages that only read.

One FastAPI application serves every episode; the cookie of a request picks its episode's
database (`rldojo.envs.web_crm.episode`). Pages: the home page, a list per record type
(search ``?q=`` over every word, 10 rows a page), and a detail page per record that links
its neighbours (list -> account -> deal). Reads query SQL directly; every write goes
through `CrmApi` (`actions`, `outreach`), so an episode's database diff is the one
crm-v1's tools would leave. Handlers are plain functions: FastAPI runs them in its thread
pool, where waiting on an episode's lock never blocks the event loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException

from rldojo.envs.web_crm.actions import router as actions_router
from rldojo.envs.web_crm.episode import (
    Episode,
    EpisodeLookup,
    NoEpisode,
    NotFound,
    Row,
    current_episode,
    record,
    rows,
)
from rldojo.envs.web_crm.outreach import router as outreach_router
from rldojo.envs.web_crm.pages import (
    PAGE_SIZE,
    esc,
    fields,
    label,
    layout,
    link,
    money,
    pager,
    paginate,
    search_form,
    table,
)

__all__ = ["create_app"]

router = APIRouter()


def create_app(episodes: EpisodeLookup) -> FastAPI:
    """The application; `episodes` maps a request's cookie token to its episode."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.episodes = episodes
    app.include_router(router)
    app.include_router(actions_router)
    app.include_router(outreach_router)
    app.add_exception_handler(NoEpisode, _no_episode)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(HTTPException, _http_error)
    return app


async def _no_episode(request: Request, exc: Exception) -> HTMLResponse:
    body = "<p>This browser has no live episode: the rldojo_episode cookie is missing.</p>"
    return HTMLResponse(layout("Forbidden", body), status_code=403)


async def _not_found(request: Request, exc: Exception) -> HTMLResponse:
    return HTMLResponse(layout("Not found", f"<p>{esc(exc)}</p>"), status_code=404)


async def _http_error(request: Request, exc: Exception) -> HTMLResponse:
    code = exc.status_code if isinstance(exc, HTTPException) else 500
    text = exc.detail if isinstance(exc, HTTPException) else "error"
    return HTMLResponse(layout(f"Error {code}", f"<p>{esc(text)}</p>"), status_code=code)


def _name(contact: Row) -> str:
    return f"{contact['first_name']} {contact['last_name']}"


# ------------------------------------------------------------------ home and lists


@router.get("/")
def home(ep: Episode = Depends(current_episode)) -> HTMLResponse:
    with ep.lock:
        counts = {t: ep.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in _LISTS}
    items = "".join(f"<li>{link(f'/{t}', t.capitalize())} ({n})</li>" for t, n in counts.items())
    return ep.page("CRM home", f"<ul>{items}</ul>")


@dataclass(frozen=True)
class _Listing:
    """One list page: its query, the columns searched, the table's headers and cells."""

    select: str
    searched: tuple[str, ...]
    headers: tuple[str, ...]
    cells: Callable[[Row], list[str]]


def _account_cells(r: Row) -> list[str]:
    cells = [esc(r[k]) for k in ("industry", "tier", "region", "owner")]
    return [r["id"], link(f"/accounts/{r['id']}", r["name"]), *cells]


def _contact_cells(r: Row) -> list[str]:
    cells = [esc(r[k]) for k in ("title", "email", "account")]
    return [r["id"], link(f"/contacts/{r['id']}", _name(r)), *cells]


def _deal_cells(r: Row) -> list[str]:
    cells = [esc(r["account"]), label(r["stage"]), money(r["amount"]), esc(r["close_date"])]
    return [r["id"], link(f"/deals/{r['id']}", r["name"]), *cells]


def _ticket_cells(r: Row) -> list[str]:
    cells = [esc(r[k]) for k in ("account", "priority", "status")]
    return [r["id"], link(f"/tickets/{r['id']}", r["subject"]), *cells]


_ACCOUNT = "(SELECT name FROM accounts WHERE id = x.account_id) AS account"
_LISTS = {
    "accounts": _Listing(
        "SELECT id, name, industry, tier, region, owner FROM accounts x",
        ("id", "name", "industry", "region", "owner"),
        ("ID", "Name", "Industry", "Tier", "Region", "Owner"),
        _account_cells,
    ),
    "contacts": _Listing(
        f"SELECT id, first_name, last_name, title, email, {_ACCOUNT} FROM contacts x",
        ("id", "first_name", "last_name", "email", "title", "account"),
        ("ID", "Name", "Title", "Email", "Account"),
        _contact_cells,
    ),
    "deals": _Listing(
        f"SELECT id, name, {_ACCOUNT}, stage, amount, close_date, owner FROM deals x",
        ("id", "name", "owner", "account"),
        ("ID", "Name", "Account", "Stage", "Amount", "Close date"),
        _deal_cells,
    ),
    "tickets": _Listing(
        f"SELECT id, subject, description, {_ACCOUNT}, priority, status FROM tickets x",
        ("id", "subject", "description", "account"),
        ("ID", "Subject", "Account", "Priority", "Status"),
        _ticket_cells,
    ),
}
"""The list pages by path: every word of ``?q=`` must match one of the searched columns
(the columns crm-v1's search tools use, plus the id and the account's name)."""


def _list_page(ep: Episode, kind: str, q: str, page: str) -> HTMLResponse:
    listing = _LISTS[kind]
    where, params = [], []
    for word in q.split():
        where.append("(" + " OR ".join(f"{c} LIKE ?" for c in listing.searched) + ")")
        params += [f"%{word}%"] * len(listing.searched)
    sql = f"SELECT * FROM ({listing.select})" + (" WHERE " + " AND ".join(where) if where else "")
    with ep.lock:
        total = ep.conn.execute(f"SELECT COUNT(*) FROM ({sql})", params).fetchone()[0]
        number, pages = paginate(total, page)
        found = rows(
            ep.conn,
            f"{sql} ORDER BY id LIMIT ? OFFSET ?",
            (*params, PAGE_SIZE, (number - 1) * PAGE_SIZE),
        )
    matched = f"{total} {kind}" + (f' match "{esc(q)}"' if q.strip() else "")
    body = (
        search_form(f"/{kind}", q)
        + f"<p>{matched}.</p>"
        + table(kind.capitalize(), listing.headers, [listing.cells(r) for r in found])
        + pager(f"/{kind}", q, number, pages)
    )
    return ep.page(kind.capitalize(), body)


@router.get("/accounts")
def accounts(q: str = "", page: str = "1", ep: Episode = Depends(current_episode)) -> HTMLResponse:
    return _list_page(ep, "accounts", q, page)


@router.get("/contacts")
def contacts(q: str = "", page: str = "1", ep: Episode = Depends(current_episode)) -> HTMLResponse:
    return _list_page(ep, "contacts", q, page)


@router.get("/deals")
def deals(q: str = "", page: str = "1", ep: Episode = Depends(current_episode)) -> HTMLResponse:
    return _list_page(ep, "deals", q, page)


@router.get("/tickets")
def tickets(q: str = "", page: str = "1", ep: Episode = Depends(current_episode)) -> HTMLResponse:
    return _list_page(ep, "tickets", q, page)


# ------------------------------------------------------------------ detail pages


def _actions(*pairs: tuple[str, str]) -> str:
    return "<p>" + " ".join(link(href, text) for href, text in pairs) + "</p>"


def _account_tables(conn: sqlite3.Connection, acc_id: str) -> str:
    by = "WHERE account_id = ? ORDER BY id"
    cons = rows(conn, f"SELECT * FROM contacts {by}", (acc_id,))
    dls = rows(conn, f"SELECT * FROM deals {by}", (acc_id,))
    tks = rows(conn, f"SELECT * FROM tickets {by}", (acc_id,))
    acts = rows(conn, f"SELECT * FROM activities {by}", (acc_id,))
    yes = {1: "yes", 0: ""}
    return (
        table(
            "Contacts",
            ("ID", "Name", "Title", "Email", "Primary"),
            [
                [
                    c["id"],
                    link(f"/contacts/{c['id']}", _name(c)),
                    esc(c["title"]),
                    esc(c["email"]),
                    yes[c["is_primary"]],
                ]
                for c in cons
            ],
        )
        + table(
            "Deals",
            ("ID", "Name", "Stage", "Amount", "Close date"),
            [
                [
                    d["id"],
                    link(f"/deals/{d['id']}", d["name"]),
                    label(d["stage"]),
                    money(d["amount"]),
                    esc(d["close_date"]),
                ]
                for d in dls
            ],
        )
        + table(
            "Tickets",
            ("ID", "Subject", "Priority", "Status"),
            [
                [
                    t["id"],
                    link(f"/tickets/{t['id']}", t["subject"]),
                    esc(t["priority"]),
                    esc(t["status"]),
                ]
                for t in tks
            ],
        )
        + table(
            "Activities",
            ("ID", "Type", "Subject", "Contact", "Deal", "Date"),
            [
                [
                    a["id"],
                    esc(a["type"]),
                    esc(a["subject"]),
                    esc(a["contact_id"]),
                    esc(a["deal_id"]),
                    esc(a["created_at"][:10]),
                ]
                for a in acts
            ],
        )
    )


@router.get("/accounts/{acc_id}")
def account_page(acc_id: str, ep: Episode = Depends(current_episode)) -> HTMLResponse:
    with ep.lock:
        acc = record(ep.conn, "accounts", acc_id, "Account")
        related = _account_tables(ep.conn, acc_id)
    info = fields(
        [
            ("ID", acc["id"]),
            ("Industry", esc(acc["industry"])),
            ("Tier", esc(acc["tier"])),
            ("Region", esc(acc["region"])),
            ("Owner", esc(acc["owner"])),
            ("Annual revenue", money(acc["annual_revenue"])),
        ]
    )
    actions = _actions(
        (f"/accounts/{acc_id}/deals/new", "New deal"),
        (f"/accounts/{acc_id}/tickets/new", "New ticket"),
        (f"/accounts/{acc_id}/activities/new", "Log activity"),
    )
    return ep.page(f"Account {acc['id']}: {acc['name']}", info + actions + related)


@router.get("/contacts/{con_id}")
def contact_page(con_id: str, ep: Episode = Depends(current_episode)) -> HTMLResponse:
    with ep.lock:
        c = record(ep.conn, "contacts", con_id, "Contact")
        acc = record(ep.conn, "accounts", c["account_id"], "Account")
    yes = {1: "yes", 0: "no"}
    info = fields(
        [
            ("ID", c["id"]),
            ("Account", link(f"/accounts/{acc['id']}", acc["name"])),
            ("Title", esc(c["title"])),
            ("Email", esc(c["email"])),
            ("Phone", esc(c["phone"])),
            ("Primary contact", yes[c["is_primary"]]),
            ("Opted out of email", yes[c["do_not_email"]]),
        ]
    )
    actions = _actions(
        (f"/contacts/{con_id}/email", "Send email"),
        (f"/accounts/{acc['id']}/activities/new?contact_id={con_id}", "Log activity"),
    )
    return ep.page(f"Contact {c['id']}: {_name(c)}", info + actions)


@router.get("/deals/{deal_id}")
def deal_page(deal_id: str, ep: Episode = Depends(current_episode)) -> HTMLResponse:
    with ep.lock:
        d = record(ep.conn, "deals", deal_id, "Deal")
        acc = record(ep.conn, "accounts", d["account_id"], "Account")
        acts = rows(ep.conn, "SELECT * FROM activities WHERE deal_id = ? ORDER BY id", (deal_id,))
    info = fields(
        [
            ("ID", d["id"]),
            ("Account", link(f"/accounts/{acc['id']}", acc["name"])),
            ("Stage", label(d["stage"])),
            ("Amount", money(d["amount"])),
            ("Probability", f"{d['probability']}%"),
            ("Close date", esc(d["close_date"])),
            ("Owner", esc(d["owner"])),
        ]
    )
    actions = _actions(
        (f"/deals/{deal_id}/edit", "Edit deal"),
        (f"/accounts/{acc['id']}/activities/new?deal_id={deal_id}", "Log activity"),
    )
    logged = table(
        "Activities",
        ("ID", "Type", "Subject", "Date"),
        [[a["id"], esc(a["type"]), esc(a["subject"]), esc(a["created_at"][:10])] for a in acts],
    )
    return ep.page(f"Deal {d['id']}: {d['name']}", info + actions + logged)


@router.get("/tickets/{tck_id}")
def ticket_page(tck_id: str, ep: Episode = Depends(current_episode)) -> HTMLResponse:
    with ep.lock:
        t = record(ep.conn, "tickets", tck_id, "Ticket")
        acc = record(ep.conn, "accounts", t["account_id"], "Account")
        who = rows(ep.conn, "SELECT * FROM contacts WHERE id = ?", (t["contact_id"],))
    contact = link(f"/contacts/{who[0]['id']}", f"{_name(who[0])} ({who[0]['id']})") if who else ""
    info = fields(
        [
            ("ID", t["id"]),
            ("Account", link(f"/accounts/{acc['id']}", acc["name"])),
            ("Contact", contact),
            ("Priority", esc(t["priority"])),
            ("Status", esc(t["status"])),
            ("Description", esc(t["description"])),
            ("Resolution", esc(t["resolution"])),
            ("Closed at", esc(t["closed_at"])),
        ]
    )
    close = (
        "" if t["status"] == "closed" else _actions((f"/tickets/{tck_id}/close", "Close ticket"))
    )
    return ep.page(f"Ticket {t['id']}: {t['subject']}", info + close)
