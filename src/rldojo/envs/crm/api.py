"""The CRM's API: the tools the agent calls, with the validation errors of a real CRM.

Every method is one tool (typed parameters and a docstring become its schema). Reads
return plain dicts; writes run in one transaction each, so a refused request changes
nothing. Refusals raise `ToolError` with the message a real API would return: unknown
ids, ids from another account, closed records, dates in the past, duplicate names,
contacts that opted out of email. Timestamps come from a simulated clock kept in the
database (``_meta.clock``, one minute per write), so the same calls give the same rows.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from typing import Any, Literal

from rldojo.envs.crm.data import STAGE_PROBABILITY, TABLES, TODAY, stamp
from rldojo.envs.tools import Tool, ToolError

__all__ = ["CrmApi"]

Stage = Literal[
    "prospecting", "qualification", "proposal", "negotiation", "closed_won", "closed_lost"
]
Priority = Literal["low", "medium", "high", "urgent"]
ActivityType = Literal["call", "email", "meeting", "note"]
_PREFIX = {"accounts": "ACC", "contacts": "CON", "deals": "DEAL", "tickets": "TCK"}
_PREFIX |= {"activities": "ACT", "emails": "EML"}
_TOOL_NAMES = (
    "search_accounts",
    "get_account",
    "search_contacts",
    "search_deals",
    "get_deal",
    "create_deal",
    "update_deal",
    "search_tickets",
    "create_ticket",
    "close_ticket",
    "log_activity",
    "send_email",
)
_SEARCH_COLS = {
    "accounts": ("name", "industry", "region", "owner"),
    "contacts": ("first_name", "last_name", "email", "title"),
    "deals": ("name", "owner"),
    "tickets": ("subject", "description"),
}


class CrmApi:
    """The CRM tools over one database connection (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def tools(self) -> list[Tool]:
        return [Tool.from_function(getattr(self, name)) for name in _TOOL_NAMES]

    # ---------------------------------------------------------------- helpers

    @contextmanager
    def _write(self) -> Iterator[str]:
        """One transaction; yields the timestamp of this write; rolls back on any error."""
        self.conn.execute("BEGIN")
        try:
            self.conn.execute("UPDATE _meta SET value = value + 1 WHERE key = 'clock'")
            (minute,) = self.conn.execute("SELECT value FROM _meta WHERE key = 'clock'").fetchone()
            yield stamp(TODAY, int(minute))
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _get(self, table: str, row_id: str) -> dict[str, Any]:
        kind = table.rstrip("s").replace("activitie", "activity")
        prefix = _PREFIX[table]
        if not isinstance(row_id, str) or not re.fullmatch(rf"{prefix}-\d{{4,6}}", row_id.strip()):
            raise ToolError(f"invalid {kind} id {row_id!r}: expected the form '{prefix}-0001'")
        cols = TABLES[table]
        row = self.conn.execute(
            f"SELECT {', '.join(cols)} FROM {table} WHERE id = ?", (row_id.strip(),)
        ).fetchone()
        if row is None:
            raise ToolError(f"{kind} {row_id} not found")
        return dict(zip(cols, row, strict=True))

    def _search(self, table: str, query: str, filters: dict[str, Any], limit: int) -> list[dict]:
        if not 1 <= limit <= 50:
            raise ToolError("limit must be between 1 and 50")
        where, params = [], []
        searched = _SEARCH_COLS[table]
        for word in query.split():
            where.append("(" + " OR ".join(f"{c} LIKE ?" for c in searched) + ")")
            params += [f"%{word}%"] * len(searched)
        for col, value in filters.items():
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        cols = TABLES[table]
        sql = f"SELECT {', '.join(cols)} FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.conn.execute(sql + " ORDER BY id LIMIT ?", (*params, limit)).fetchall()
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def _next_id(self, table: str) -> str:
        prefix = _PREFIX[table]
        number = f"CAST(substr(id, {len(prefix) + 2}) AS INTEGER)"
        (last,) = self.conn.execute(f"SELECT MAX({number}) FROM {table}").fetchone()
        return f"{prefix}-{(last or 0) + 1:04d}"

    def _belongs(self, table: str, row_id: str | None, account_id: str) -> dict | None:
        if row_id is None:
            return None
        row = self._get(table, row_id)
        if row["account_id"] != account_id:
            raise ToolError(f"{row_id} belongs to account {row['account_id']}, not {account_id}")
        return row

    @staticmethod
    def _date(value: str, field: str) -> date:
        try:
            return date.fromisoformat(value)
        except (TypeError, ValueError):
            raise ToolError(f"{field} must be a date YYYY-MM-DD, got {value!r}") from None

    @staticmethod
    def _text(value: str, field: str, minimum: int = 1) -> str:
        value = value.strip()
        if len(value) < minimum:
            raise ToolError(f"{field} must not be empty" if minimum == 1 else f"{field} too short")
        return value

    # ---------------------------------------------------------------- reads

    def search_accounts(
        self, query: str = "", industry: str | None = None, tier: str | None = None, limit: int = 10
    ) -> list[dict]:
        """Find accounts whose name, industry, region or owner contain every word of `query`."""
        return self._search("accounts", query, {"industry": industry, "tier": tier}, limit)

    def get_account(self, account_id: str) -> dict:
        """One account with its number of contacts, open deals and open tickets."""
        acc = self._get("accounts", account_id)
        for key, sql in (
            ("contacts", "SELECT COUNT(*) FROM contacts WHERE account_id = ?"),
            (
                "open_deals",
                "SELECT COUNT(*) FROM deals WHERE account_id = ? AND stage NOT LIKE 'closed%'",
            ),
            (
                "open_tickets",
                "SELECT COUNT(*) FROM tickets WHERE account_id = ? AND status != 'closed'",
            ),
        ):
            acc[key] = self.conn.execute(sql, (acc["id"],)).fetchone()[0]
        return acc

    def search_contacts(
        self, query: str = "", account_id: str | None = None, limit: int = 10
    ) -> list[dict]:
        """Find contacts by name, email or title words, optionally within one account."""
        return self._search("contacts", query, {"account_id": account_id}, limit)

    def search_deals(
        self,
        query: str = "",
        account_id: str | None = None,
        stage: Stage | None = None,
        limit: int = 10,
    ) -> list[dict]:
        """Find deals by name words, optionally by account and stage."""
        return self._search("deals", query, {"account_id": account_id, "stage": stage}, limit)

    def get_deal(self, deal_id: str) -> dict:
        """One deal."""
        return self._get("deals", deal_id)

    def search_tickets(
        self,
        query: str = "",
        account_id: str | None = None,
        status: Literal["open", "pending", "closed"] | None = None,
        priority: Priority | None = None,
        limit: int = 10,
    ) -> list[dict]:
        """Find support tickets by subject words, optionally by account, status and priority."""
        filters = {"account_id": account_id, "status": status, "priority": priority}
        return self._search("tickets", query, filters, limit)

    # ---------------------------------------------------------------- writes

    def create_deal(
        self,
        account_id: str,
        name: str,
        amount: int,
        stage: Stage = "prospecting",
        close_date: str | None = None,
    ) -> dict:
        """Create a deal for an account.

        Args:
            account_id: the account, e.g. ACC-0001.
            name: deal name, unique within the account.
            amount: value in whole dollars (> 0).
            stage: initial stage.
            close_date: expected close date YYYY-MM-DD (today or later); default in 90 days.
        """
        acc = self._get("accounts", account_id)
        name = self._text(name, "name")
        if amount <= 0:
            raise ToolError("amount must be a positive number of dollars")
        if stage.startswith("closed"):
            raise ToolError("a new deal cannot start closed; create it, then update its stage")
        close = self._date(close_date, "close_date") if close_date else None
        if close is not None and close < TODAY:
            raise ToolError(f"close_date {close_date} is in the past (today is {TODAY})")
        dup = "SELECT id FROM deals WHERE account_id = ? AND lower(name) = lower(?)"
        if self.conn.execute(dup, (acc["id"], name)).fetchone():
            raise ToolError(f"account {acc['id']} already has a deal named {name!r}")
        with self._write() as now:
            row = {
                "id": self._next_id("deals"),
                "account_id": acc["id"],
                "name": name,
                "stage": stage,
                "amount": amount,
                "probability": STAGE_PROBABILITY[stage],
                "close_date": (close or date.fromordinal(TODAY.toordinal() + 90)).isoformat(),
                "owner": acc["owner"],
                "created_at": now,
                "updated_at": now,
            }
            self._insert("deals", row)
        return row

    def update_deal(
        self,
        deal_id: str,
        stage: Stage | None = None,
        amount: int | None = None,
        close_date: str | None = None,
    ) -> dict:
        """Change a deal's stage, amount or close date (closed deals cannot be changed)."""
        deal = self._get("deals", deal_id)
        if stage is None and amount is None and close_date is None:
            raise ToolError("nothing to update: give stage, amount or close_date")
        if deal["stage"] in ("closed_won", "closed_lost"):
            raise ToolError(f"deal {deal['id']} is {deal['stage']}; closed deals cannot be changed")
        if amount is not None and amount <= 0:
            raise ToolError("amount must be a positive number of dollars")
        past = close_date is not None and self._date(close_date, "close_date") < TODAY
        if past and not (stage or "").startswith("closed"):
            raise ToolError(f"close_date {close_date} is in the past (today is {TODAY})")
        changes: dict[str, Any] = {"stage": stage, "amount": amount, "close_date": close_date}
        changes = {k: v for k, v in changes.items() if v is not None}
        if stage is not None:
            changes["probability"] = STAGE_PROBABILITY[stage]
        with self._write() as now:
            changes["updated_at"] = now
            sets = ", ".join(f"{k} = ?" for k in changes)
            self.conn.execute(
                f"UPDATE deals SET {sets} WHERE id = ?", (*changes.values(), deal["id"])
            )
        return self._get("deals", deal["id"])

    def create_ticket(
        self,
        account_id: str,
        subject: str,
        description: str = "",
        priority: Priority = "medium",
        contact_id: str | None = None,
    ) -> dict:
        """Open a support ticket for an account (optionally on behalf of one of its contacts)."""
        acc = self._get("accounts", account_id)
        subject = self._text(subject, "subject")
        self._belongs("contacts", contact_id, acc["id"])
        with self._write() as now:
            row = {
                "id": self._next_id("tickets"),
                "account_id": acc["id"],
                "contact_id": contact_id,
                "subject": subject,
                "description": description.strip(),
                "priority": priority,
                "status": "open",
                "resolution": None,
                "created_at": now,
                "updated_at": now,
                "closed_at": None,
            }
            self._insert("tickets", row)
        return row

    def close_ticket(self, ticket_id: str, resolution: str) -> dict:
        """Close a ticket with a resolution note (at least 5 characters)."""
        ticket = self._get("tickets", ticket_id)
        if ticket["status"] == "closed":
            raise ToolError(f"ticket {ticket['id']} is already closed")
        resolution = self._text(resolution, "resolution", minimum=5)
        with self._write() as now:
            self.conn.execute(
                "UPDATE tickets SET status = 'closed', resolution = ?, updated_at = ?,"
                " closed_at = ? WHERE id = ?",
                (resolution, now, now, ticket["id"]),
            )
        return self._get("tickets", ticket["id"])

    def log_activity(
        self,
        account_id: str,
        type: ActivityType,
        subject: str,
        notes: str = "",
        contact_id: str | None = None,
        deal_id: str | None = None,
    ) -> dict:
        """Record a call, email, meeting or note on an account (and its contact or deal)."""
        acc = self._get("accounts", account_id)
        subject = self._text(subject, "subject")
        self._belongs("contacts", contact_id, acc["id"])
        self._belongs("deals", deal_id, acc["id"])
        with self._write() as now:
            row = {
                "id": self._next_id("activities"),
                "account_id": acc["id"],
                "contact_id": contact_id,
                "deal_id": deal_id,
                "ticket_id": None,
                "type": type,
                "subject": subject,
                "notes": notes.strip(),
                "created_at": now,
            }
            self._insert("activities", row)
        return row

    def send_email(
        self,
        contact_id: str,
        subject: str,
        body: str,
        deal_id: str | None = None,
        ticket_id: str | None = None,
    ) -> dict:
        """Email a contact (recorded in the outbox), optionally about a deal or ticket."""
        contact = self._get("contacts", contact_id)
        if contact["do_not_email"]:
            raise ToolError(f"contact {contact['id']} has opted out of email (do_not_email)")
        subject, body = self._text(subject, "subject"), self._text(body, "body")
        self._belongs("deals", deal_id, contact["account_id"])
        self._belongs("tickets", ticket_id, contact["account_id"])
        with self._write() as now:
            row = {
                "id": self._next_id("emails"),
                "to_contact_id": contact["id"],
                "to_address": contact["email"],
                "subject": subject,
                "body": body,
                "deal_id": deal_id,
                "ticket_id": ticket_id,
                "sent_at": now,
            }
            self._insert("emails", row)
        return {"id": row["id"], "status": "queued", "to": row["to_address"]}

    def _insert(self, table: str, row: dict[str, Any]) -> None:
        cols = ", ".join(row)
        marks = ", ".join("?" * len(row))
        self.conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(row.values()))
