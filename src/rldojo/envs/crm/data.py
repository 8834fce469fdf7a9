"""The CRM database: schema, deterministic generation from a seed, and the change log.

One SQLite database in memory holds accounts, contacts, deals, tickets, activities and
the outbox of emails (recorded, never sent). `build_database(seed, size)` fills it from
``random.Random(f"crm-v1:db:{size}:{seed}")`` only, so a seed always gives the same bytes.

Change tracking: after generation, triggers on every table record the *before image* of
each row the first time it is touched in an episode (``_changes``; NULL for a row the
episode inserted). `diff(conn)` compares those images with the rows now, which costs
O(rows touched), not O(database); the grader reads the result. Internal tables
(``_changes``, ``_meta``) start with an underscore and are hidden from the SQL tool.

`base_snapshot(seed, size)` returns the serialized database, built once per process and
kept in a small LRU cache, so the N rollouts of a group (and every reset on the same
database) start from one snapshot with a ~0.1 ms ``deserialize``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import sqlite3
from datetime import date, timedelta
from typing import Any, Literal, get_args

__all__ = [
    "DB_SIZES",
    "STAGES",
    "TABLES",
    "TODAY",
    "DbSize",
    "base_snapshot",
    "build_database",
    "connect",
    "diff",
    "state_digest",
]

TODAY = date(2025, 6, 2)
"""The simulated current date of every database (deterministic timestamps)."""
DbSize = Literal["small", "default", "large"]
DB_SIZES: dict[str, int] = dict(zip(get_args(DbSize), (20, 60, 400), strict=True))
"""Accounts per database of each size (crm-v1's `db_size`); the other tables scale with it."""
STAGES = ("prospecting", "qualification", "proposal", "negotiation", "closed_won", "closed_lost")
OPEN_STAGES = STAGES[:4]
STAGE_PROBABILITY = dict(zip(STAGES, (10, 20, 50, 70, 100, 0), strict=True))
TIERS = ("bronze", "silver", "gold", "platinum")
PRIORITIES = ("low", "medium", "high", "urgent")
ACTIVITY_TYPES = ("call", "email", "meeting", "note")
BOOKKEEPING = frozenset({"updated_at", "closed_at", "probability"})
"""Fields the API sets as a side effect of an allowed change; never collateral."""

_SCHEMA = """
CREATE TABLE accounts (id TEXT PRIMARY KEY, name TEXT NOT NULL, industry TEXT, tier TEXT,
  region TEXT, owner TEXT, annual_revenue INTEGER, created_at TEXT, updated_at TEXT);
CREATE TABLE contacts (id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id),
  first_name TEXT, last_name TEXT, email TEXT, phone TEXT, title TEXT,
  is_primary INTEGER DEFAULT 0, do_not_email INTEGER DEFAULT 0,
  created_at TEXT, updated_at TEXT);
CREATE TABLE deals (id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id),
  name TEXT NOT NULL, stage TEXT NOT NULL, amount INTEGER NOT NULL, probability INTEGER,
  close_date TEXT, owner TEXT, created_at TEXT, updated_at TEXT);
CREATE TABLE tickets (id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id),
  contact_id TEXT REFERENCES contacts(id), subject TEXT NOT NULL, description TEXT,
  priority TEXT NOT NULL, status TEXT NOT NULL, resolution TEXT,
  created_at TEXT, updated_at TEXT, closed_at TEXT);
CREATE TABLE activities (id TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id),
  contact_id TEXT, deal_id TEXT, ticket_id TEXT, type TEXT NOT NULL, subject TEXT NOT NULL,
  notes TEXT, created_at TEXT);
CREATE TABLE emails (id TEXT PRIMARY KEY, to_contact_id TEXT NOT NULL, to_address TEXT NOT NULL,
  subject TEXT NOT NULL, body TEXT NOT NULL, deal_id TEXT, ticket_id TEXT, sent_at TEXT);
CREATE TABLE _meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE _changes (tbl TEXT NOT NULL, id TEXT NOT NULL, before TEXT,
  PRIMARY KEY (tbl, id));
"""


def _words(text: str) -> list[str]:
    return text.split()


TABLES: dict[str, list[str]] = {
    "accounts": _words("id name industry tier region owner annual_revenue created_at updated_at"),
    "contacts": _words(
        "id account_id first_name last_name email phone title is_primary do_not_email "
        "created_at updated_at"
    ),
    "deals": _words(
        "id account_id name stage amount probability close_date owner created_at updated_at"
    ),
    "tickets": _words(
        "id account_id contact_id subject description priority status resolution "
        "created_at updated_at closed_at"
    ),
    "activities": _words(
        "id account_id contact_id deal_id ticket_id type subject notes created_at"
    ),
    "emails": _words("id to_contact_id to_address subject body deal_id ticket_id sent_at"),
}
"""Tracked tables and their columns, in schema order."""

_FIRST = _words(
    "Ava Ben Chloe Dan Elena Farid Grace Hugo Iris Jon Kira Liam Maya Noah Olga Pablo Quinn "
    "Rosa Sam Tara Umar Vera Wes Xena Yusuf Zoe Aaron Bianca Carlos Dina Emil Fatima Goran "
    "Hana Ivan Julia Kenji Lena Marco Nadia"
)
_LAST = _words(
    "Adams Baker Chen Dubois Evans Fischer Garcia Hansen Ito Jensen Kowalski Lopez Meyer "
    "Novak Okafor Patel Quinn Rossi Silva Tanaka Ueda Varga Weber Xu Young Zhang Berg Costa "
    "Diaz Ek"
)
_WORDS = _words(
    "Acme Apex Blue Bright Cedar Cobalt Delta Ember Falcon Granite Harbor Helix Iron Juniper "
    "Keystone Lumen Maple Meridian Nimbus Northwind Orion Pioneer Quartz Redwood Summit "
    "Silver Tidal Union Vertex Willow Zenith Atlas Beacon Crest Drift Evergreen Frontier "
    "Horizon Lotus Polar"
)
_SUFFIX = _words(
    "Labs Logistics Health Systems Foods Energy Capital Retail Media Robotics Bank Schools"
)
_INDUSTRY = {
    "Labs": "Software",
    "Systems": "Software",
    "Robotics": "Manufacturing",
    "Logistics": "Logistics",
    "Health": "Healthcare",
    "Foods": "Retail",
    "Retail": "Retail",
    "Energy": "Energy",
    "Capital": "Finance",
    "Bank": "Finance",
    "Media": "Media",
    "Schools": "Education",
}
_REGIONS = ("NA", "EMEA", "APAC", "LATAM")
OWNERS = ("Priya Nair", "Tom Becker", "Lucia Romero", "Kwame Mensah", "Sofia Lind", "Raj Mehta")
_TITLES = ("CTO", "VP Sales", "Head of IT", "Procurement Lead", "CFO", "Operations Manager")
_PRODUCTS = (
    "Platform Renewal",
    "Expansion",
    "Pilot",
    "Support Upgrade",
    "Analytics Add-on",
    "Enterprise License",
    "Training Package",
)
TICKET_SUBJECTS = (
    "Cannot log in after password reset",
    "Invoice shows the wrong amount",
    "Data export fails with a timeout",
    "Dashboard loads very slowly",
    "API returns rate limit errors",
    "SSO configuration help",
    "Request: bulk edit for records",
    "Email notifications not arriving",
)
_ACTIVITY_SUBJECTS = ("Intro call", "Quarterly review", "Pricing discussion", "Demo", "Follow-up")


def stamp(day: date, minute: int = 0) -> str:
    """An ISO timestamp on `day` at 09:00 plus `minute` minutes."""
    return f"{day.isoformat()}T{9 + minute // 60:02d}:{minute % 60:02d}:00"


def connect() -> sqlite3.Connection:
    """A private in-memory connection in autocommit mode (the API opens its transactions)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _past(rng: random.Random, lo: int, hi: int) -> date:
    return TODAY - timedelta(days=rng.randint(lo, hi))


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    cols = ", ".join(row)
    conn.execute(
        f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
    )


def _account_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    names = [f"{w} {s}" for w in _WORDS for s in _SUFFIX]
    rng.shuffle(names)
    rows = []
    for i, name in enumerate(names[:n], start=1):
        created = _past(rng, 200, 900)
        rows.append(
            {
                "id": f"ACC-{i:04d}",
                "name": name,
                "industry": _INDUSTRY[name.split()[-1]],
                "tier": rng.choices(TIERS, weights=(4, 3, 2, 1))[0],
                "region": rng.choice(_REGIONS),
                "owner": rng.choice(OWNERS),
                "annual_revenue": rng.randint(5, 900) * 100_000,
                "created_at": stamp(created),
                "updated_at": stamp(created),
            }
        )
    return rows


Row = dict[str, Any]


def _contacts(rng: random.Random, acc: Row, ids: dict[str, int]) -> list[Row]:
    domain = acc["name"].lower().replace(" ", "") + ".example"
    rows = []
    for k in range(rng.randint(2, 4)):
        ids["CON"] += 1
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        day = _past(rng, 30, 200)
        rows.append(
            {
                "id": f"CON-{ids['CON']:04d}",
                "account_id": acc["id"],
                "first_name": first,
                "last_name": last,
                "email": f"{first.lower()}.{last.lower()}@{domain}",
                "phone": f"+1-555-{ids['CON']:04d}",
                "title": rng.choice(_TITLES),
                "is_primary": int(k == 0),
                "do_not_email": int(k > 0 and rng.random() < 0.15),
                "created_at": stamp(day),
                "updated_at": stamp(day),
            }
        )
    return rows


def _deals(rng: random.Random, acc: Row, ids: dict[str, int]) -> list[Row]:
    rows = []
    for product in rng.sample(_PRODUCTS, rng.randint(1, 4)):
        ids["DEAL"] += 1
        stage = rng.choices(STAGES, weights=(3, 3, 3, 3, 2, 1))[0]
        closed = stage.startswith("closed")
        close = TODAY + timedelta(days=rng.randint(-120, -5) if closed else rng.randint(-40, 150))
        day = _past(rng, 10, 180)
        rows.append(
            {
                "id": f"DEAL-{ids['DEAL']:04d}",
                "account_id": acc["id"],
                "name": f"{acc['name'].split()[0]} {product}",
                "stage": stage,
                "amount": rng.randint(10, 500) * 500,
                "probability": STAGE_PROBABILITY[stage],
                "close_date": close.isoformat(),
                "owner": acc["owner"],
                "created_at": stamp(day),
                "updated_at": stamp(day),
            }
        )
    return rows


def _tickets(rng: random.Random, acc: Row, contacts: list[Row], ids: dict[str, int]) -> list[Row]:
    rows = []
    for subject in rng.sample(TICKET_SUBJECTS, rng.randint(0, 3)):
        ids["TCK"] += 1
        status = rng.choices(("open", "pending", "closed"), weights=(4, 2, 3))[0]
        day = _past(rng, 1, 90)
        rows.append(
            {
                "id": f"TCK-{ids['TCK']:04d}",
                "account_id": acc["id"],
                "contact_id": rng.choice(contacts)["id"],
                "subject": subject,
                "description": f"{acc['name']} reports: {subject.lower()}.",
                "priority": rng.choices(PRIORITIES, weights=(3, 4, 2, 1))[0],
                "status": status,
                "resolution": "Resolved by support." if status == "closed" else None,
                "created_at": stamp(day),
                "updated_at": stamp(day),
                "closed_at": stamp(day + timedelta(days=1)) if status == "closed" else None,
            }
        )
    return rows


def _activities(
    rng: random.Random, acc: Row, contacts: list[Row], deals: list[Row], ids: dict[str, int]
) -> list[Row]:
    rows = []
    for _ in range(rng.randint(1, 4)):
        ids["ACT"] += 1
        deal_id = rng.choice(deals)["id"] if deals and rng.random() < 0.6 else None
        rows.append(
            {
                "id": f"ACT-{ids['ACT']:04d}",
                "account_id": acc["id"],
                "contact_id": rng.choice(contacts)["id"],
                "deal_id": deal_id,
                "ticket_id": None,
                "type": rng.choice(ACTIVITY_TYPES),
                "subject": rng.choice(_ACTIVITY_SUBJECTS),
                "notes": "",
                "created_at": stamp(_past(rng, 1, 120)),
            }
        )
    return rows


def _fill_account(
    rng: random.Random, conn: sqlite3.Connection, acc: Row, ids: dict[str, int]
) -> None:
    """Contacts, deals, tickets and activities of one account (in this order: seeded)."""
    contacts = _contacts(rng, acc, ids)
    deals = _deals(rng, acc, ids)
    tables = {
        "contacts": contacts,
        "deals": deals,
        "tickets": _tickets(rng, acc, contacts, ids),
        "activities": _activities(rng, acc, contacts, deals, ids),
    }
    for table, rows in tables.items():
        for row in rows:
            _insert(conn, table, row)


def _install_triggers(conn: sqlite3.Connection) -> None:
    for table, cols in TABLES.items():
        image = "json_object(" + ", ".join(f"'{c}', OLD.{c}" for c in cols) + ")"
        conn.executescript(
            f"""
            CREATE TRIGGER {table}_ins AFTER INSERT ON {table} BEGIN
              INSERT OR IGNORE INTO _changes VALUES ('{table}', NEW.id, NULL); END;
            CREATE TRIGGER {table}_upd AFTER UPDATE ON {table} BEGIN
              INSERT OR IGNORE INTO _changes VALUES ('{table}', OLD.id, {image}); END;
            CREATE TRIGGER {table}_del AFTER DELETE ON {table} BEGIN
              INSERT OR IGNORE INTO _changes VALUES ('{table}', OLD.id, {image}); END;
            """
        )


def build_database(seed: int, size: str = "default") -> sqlite3.Connection:
    """A new in-memory CRM database generated from `seed` (deterministic)."""
    if size not in DB_SIZES:
        raise ValueError(f"crm-v1: db_size must be one of {sorted(DB_SIZES)}, got {size!r}")
    rng = random.Random(f"crm-v1:db:{size}:{seed}")
    conn = connect()
    conn.executescript(_SCHEMA)
    conn.execute("BEGIN")
    ids = {"CON": 0, "DEAL": 0, "TCK": 0, "ACT": 0}
    for acc in _account_rows(rng, DB_SIZES[size]):
        _insert(conn, "accounts", acc)
        _fill_account(rng, conn, acc, ids)
    conn.execute("INSERT INTO _meta VALUES ('clock', 0)")
    conn.execute("COMMIT")
    _install_triggers(conn)
    conn.execute("VACUUM")  # compact pages: smaller snapshots, canonical layout
    return conn


@functools.lru_cache(maxsize=16)
def base_snapshot(seed: int, size: str = "default") -> bytes:
    """The serialized start database for `(seed, size)`, built once per process."""
    conn = build_database(seed, size)
    try:
        return conn.serialize()
    finally:
        conn.close()


def _row(conn: sqlite3.Connection, table: str, row_id: str) -> dict[str, Any] | None:
    cols = TABLES[table]
    found = conn.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE id = ?", (row_id,))
    values = found.fetchone()
    return None if values is None else dict(zip(cols, values, strict=True))


def diff(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Rows changed since the episode started: ``{table, id, op, before, after}``, sorted.

    `op` is ``insert``, ``update`` or ``delete``; rows changed and changed back, or
    inserted and deleted again, are not listed.
    """
    out = []
    for table, row_id, before_json in conn.execute(
        "SELECT tbl, id, before FROM _changes ORDER BY tbl, id"
    ).fetchall():
        before = None if before_json is None else json.loads(before_json)
        after = _row(conn, table, row_id)
        if before == after:
            continue
        op = "insert" if before is None else ("delete" if after is None else "update")
        out.append({"table": table, "id": row_id, "op": op, "before": before, "after": after})
    return out


def state_digest(conn: sqlite3.Connection) -> str:
    """SHA-256 of every tracked row in a canonical order (equal state, equal digest)."""
    h = hashlib.sha256()
    for table, cols in TABLES.items():
        for row in conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY id"):
            h.update(json.dumps([table, *row], default=str).encode())
    return h.hexdigest()
