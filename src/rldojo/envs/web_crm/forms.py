"""Forms of web-crm-v1: the fields, the form around them, and the parsing of what comes back.

Every field has a ``<label for=...>`` (an accessibility tree names a field by its label),
every button has text, and a refused submission comes back as the same form with the
user's values kept and the reason in an element with ``role="alert"``. Values arrive as
text; `parse_amount`, `pick` and `optional` turn them into what `CrmApi` takes, raising
`FormError` for what does not parse (an amount of "12k"). Amounts and dates are text
inputs, not ``type=number``/``date``: the server, not the browser, says what is wrong.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence

from rldojo.envs.web_crm.episode import rows
from rldojo.envs.web_crm.pages import esc, label, link

__all__ = [
    "DATE",
    "FormError",
    "Options",
    "area",
    "cancel",
    "choices",
    "form",
    "optional",
    "parse_amount",
    "pick",
    "related",
    "select",
    "text",
]

Options = Sequence[tuple[str, str]]
"""``(value, text)`` of each option of a select."""
DATE = "YYYY-MM-DD"
"""The placeholder of a date field."""


class FormError(ValueError):
    """A submitted value that does not parse; the message is shown to the user."""


def text(name: str, label: str, value: str = "", hint: str = "") -> str:
    """A one-line text field; `hint` becomes its placeholder (e.g. ``YYYY-MM-DD``)."""
    holder = f' placeholder="{esc(hint)}"' if hint else ""
    return (
        f'<p><label for="{name}">{esc(label)}</label> <input id="{name}" name="{name}"'
        f' type="text" value="{esc(value)}"{holder}></p>'
    )


def area(name: str, label: str, value: str = "") -> str:
    """A multi-line text field."""
    return (
        f'<p><label for="{name}">{esc(label)}</label><br><textarea id="{name}" name="{name}"'
        f' rows="3" cols="50">{esc(value)}</textarea></p>'
    )


def select(name: str, label: str, options: Options, selected: str = "") -> str:
    """A drop-down; the option whose value is `selected` starts selected."""
    items = "".join(
        f'<option value="{esc(v)}"{" selected" if v == selected else ""}>{esc(t)}</option>'
        for v, t in options
    )
    field = f'<select id="{name}" name="{name}">{items}</select>'
    return f'<p><label for="{name}">{esc(label)}</label> {field}</p>'


def form(action: str, parts: Sequence[str], button: str, error: str | None = None) -> str:
    """A POST form of `parts` and one submit button; `error` above it as an alert."""
    alert = f'<div role="alert">{esc(error)}</div>' if error else ""
    return (
        f'{alert}<form method="post" action="{esc(action)}">{"".join(parts)}'
        f'<p><button type="submit">{esc(button)}</button></p></form>'
    )


def cancel(href: str) -> str:
    """The "Cancel" link under a form, back to the record."""
    return f"<p>{link(href, 'Cancel')}</p>"


def choices(values: Sequence[str]) -> Options:
    """Options of stored codes, shown as people read them (``closed won``)."""
    return [(v, label(v)) for v in values]


def related(conn: sqlite3.Connection, table: str, acc_id: str) -> Options:
    """``(none)``, then the account's contacts, deals or tickets, each with its id."""
    shown = {"contacts": "first_name || ' ' || last_name", "deals": "name", "tickets": "subject"}
    found = rows(
        conn,
        f"SELECT id, {shown[table]} AS text FROM {table} WHERE account_id = ? ORDER BY id",
        (acc_id,),
    )
    return [("", "(none)"), *((r["id"], f"{r['text']} ({r['id']})") for r in found)]


def parse_amount(value: str) -> int:
    """Whole dollars from ``12000``, ``12,000`` or ``$12,000``; anything else is refused."""
    cleaned = value.strip().removeprefix("$").replace(",", "")
    if not re.fullmatch(r"-?\d+", cleaned):
        raise FormError(f"amount must be a whole number of dollars such as 12000, got {value!r}")
    return int(cleaned)


def pick(value: str, allowed: Sequence[str], field: str) -> str:
    """`value` if it is one of `allowed` (a select's options), else `FormError`."""
    if value not in allowed:
        raise FormError(f"{field} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def optional(value: str) -> str | None:
    """An optional field: its stripped text, or None when empty."""
    return value.strip() or None
