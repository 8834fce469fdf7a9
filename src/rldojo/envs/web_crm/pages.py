"""The HTML of web-crm-v1's pages: the layout, links, tables, field lists and pagination.

Pages are plain server-rendered HTML for an agent that reads them as an accessibility
tree: no JavaScript, no external assets, one tiny inline style. Every table has header
cells, every record shows its id (``DEAL-0012``), and a flash message after a write sits
in an element with ``role="status"``. Everything here is pure string building; callers
pass cells that are already HTML and escape data with `esc`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from urllib.parse import urlencode

__all__ = [
    "PAGE_SIZE",
    "esc",
    "fields",
    "label",
    "layout",
    "link",
    "money",
    "pager",
    "paginate",
    "search_form",
    "table",
]

PAGE_SIZE = 10
"""Rows per list page (a page stays a few hundred words of text)."""

_STYLE = (
    "body{font-family:sans-serif;margin:1em;max-width:60em}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "th,td{border:1px solid #bbb;padding:2px 6px;text-align:left}"
    "[role=alert]{color:#a00;font-weight:bold}[role=status]{color:#060}"
)
_NAV = (
    ("/", "Home"),
    ("/accounts", "Accounts"),
    ("/contacts", "Contacts"),
    ("/deals", "Deals"),
    ("/tickets", "Tickets"),
)


def esc(value: object) -> str:
    """`value` as HTML text (None as an empty string)."""
    return "" if value is None else html.escape(str(value), quote=True)


def label(code: str | None) -> str:
    """A stored code as people read it: ``closed_won`` -> ``closed won``."""
    return (code or "").replace("_", " ")


def money(amount: int | None) -> str:
    """Whole dollars with thousands separators: ``$12,500``."""
    return "" if amount is None else f"${amount:,}"


def link(href: str, text: object) -> str:
    """An anchor with escaped text."""
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def layout(title: str, body: str, flash: str | None = None) -> str:
    """A whole page: the navigation, the flash message (if any), the title and `body`."""
    nav = " ".join(link(href, text) for href, text in _NAV)
    status = f'<p role="status">{esc(flash)}</p>' if flash else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<title>{esc(title)} - CRM</title><link rel="icon" href="data:,">'
        f"<style>{_STYLE}</style></head><body>"
        f'<nav aria-label="Main">{nav}</nav><main>{status}<h1>{esc(title)}</h1>{body}</main>'
        "</body></html>"
    )


def table(caption: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table with a caption and a header row; `rows` hold HTML cells. No rows: a line."""
    if not rows:
        return f"<p>{esc(caption)}: none.</p>"
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f"<table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """A record's fields as a two-column table of header cells and HTML values."""
    rows = "".join(f'<tr><th scope="row">{esc(k)}</th><td>{v}</td></tr>' for k, v in pairs)
    return f"<table>{rows}</table>"


def paginate(total: int, page: str) -> tuple[int, int]:
    """The page to show (1-based, clamped into range; junk reads as 1) and the count."""
    pages = max(1, math.ceil(total / PAGE_SIZE))
    number = int(page) if page.strip().isdigit() else 1
    return min(max(number, 1), pages), pages


def search_form(action: str, query: str) -> str:
    """The GET search form of a list page."""
    return (
        f'<form method="get" action="{esc(action)}" role="search">'
        '<label for="q">Search</label> '
        f'<input id="q" name="q" type="text" value="{esc(query)}"> '
        '<button type="submit">Search</button></form>'
    )


def pager(path: str, query: str, page: int, pages: int) -> str:
    """ "Previous" and "Next" links around "Page k of n" (the search words kept)."""

    def href(number: int) -> str:
        params = {"q": query, "page": number} if query else {"page": number}
        return f"{path}?{urlencode(params)}"

    parts = [link(href(page - 1), "Previous")] if page > 1 else []
    parts.append(f"Page {page} of {pages}")
    if page < pages:
        parts.append(link(href(page + 1), "Next"))
    return f'<nav aria-label="Pages"><p>{" ".join(parts)}</p></nav>'
