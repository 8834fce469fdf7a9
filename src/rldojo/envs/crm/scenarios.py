"""crm-v1 task scenarios: templates at four difficulty levels, and the knowledge base.

Each template reads the start database and writes a request plus its verdict:

    expected.updates  [{table, id, set: {field: value}}]     rows that must end so
    expected.inserts  [{table, match: {field: spec}, count}] new rows that must exist
    mentions          facts the final answer must state (lookups, counts, choices)

A spec is a value (equal after normalising numbers), ``{"contains": text}``
(case-insensitive substring) or ``{"present": true}`` (not null). Levels:

1. single lookup (an email, a deal's stage, an account owner, a count);
2. one update (move a deal, close a ticket, log a call, open a ticket);
3. several updates (win a deal and thank the contact, close all urgent tickets and
   report how many, create a deal and log a note on it);
4. updates with conditions (stage by amount, the discount allowed by the knowledge
   base's policy for the account's tier, close every overdue deal as lost).

Templates only ask for changes that differ from the start state, so an untouched
database never passes a state check.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from rldojo.envs.crm.data import OPEN_STAGES, STAGES, TABLES, TICKET_SUBJECTS, TODAY, base_snapshot

__all__ = [
    "DISCOUNTS",
    "KNOWLEDGE_BASE",
    "TEMPLATES",
    "Scenario",
    "ScenarioDb",
    "Template",
    "make_scenario",
]

Scenario = dict[str, Any]
"""``{"template", "level", "prompt", "expected", "mentions"}``."""

DISCOUNTS = {"bronze": 5, "silver": 8, "gold": 10, "platinum": 15}
"""Largest discount (percent) by account tier; stated in the knowledge base."""

KNOWLEDGE_BASE: list[dict[str, str]] = [
    {
        "id": "KB-1",
        "title": "Discount policy",
        "text": "Sales reps may discount an open deal by at most: "
        + ", ".join(f"{p}% for {t} accounts" for t, p in DISCOUNTS.items())
        + ". The discounted amount is rounded down to whole dollars. Closed deals are never "
        "discounted.",
    },
    {
        "id": "KB-2",
        "title": "Deal stages",
        "text": "Stages in order: prospecting, qualification, proposal, negotiation, then "
        "closed_won or closed_lost. A deal whose close date has passed without a win is "
        "marked closed_lost.",
    },
    {
        "id": "KB-3",
        "title": "Support priorities and SLA",
        "text": "Urgent tickets get a first reply within 1 hour, high within 4 hours, "
        "medium within 1 business day, low within 3 business days.",
    },
    {
        "id": "KB-4",
        "title": "Closing tickets",
        "text": "Close a ticket only with a resolution that says what was done. Pending "
        "tickets wait on the customer and may be closed once resolved.",
    },
    {
        "id": "KB-5",
        "title": "Email etiquette",
        "text": "Never email contacts marked do_not_email. Thank-you emails after a won deal "
        "go to the account's primary contact.",
    },
    {
        "id": "KB-6",
        "title": "Refund policy",
        "text": "Refunds above $5,000 need approval from finance. Refunds are issued as "
        "credit notes within 10 business days.",
    },
    {
        "id": "KB-7",
        "title": "Account tiers",
        "text": "Tiers are bronze, silver, gold and platinum, reviewed yearly by annual "
        "revenue and contract value.",
    },
]

_RESOLUTIONS = (
    "Reset the user's password and confirmed login",
    "Issued a corrected invoice",
    "Raised the export timeout and re-ran the job",
    "Tuned the dashboard queries",
    "Increased the API rate limit",
)
_CALL_SUBJECTS = ("Renewal check-in", "Onboarding review", "Budget planning", "Product feedback")


class ScenarioDb:
    """The start database's rows as dicts, for choosing entities."""

    def __init__(self, seed: int, size: str) -> None:
        conn = sqlite3.connect(":memory:")
        conn.deserialize(base_snapshot(seed, size))
        self.rows: dict[str, list[dict[str, Any]]] = {}
        for table in ("accounts", "contacts", "deals", "tickets"):
            cols = TABLES[table]
            query = f"SELECT {', '.join(cols)} FROM {table} ORDER BY id"
            self.rows[table] = [dict(zip(cols, r, strict=True)) for r in conn.execute(query)]
        conn.close()
        self.account = {a["id"]: a for a in self.rows["accounts"]}

    def where(self, table: str, **eq: object) -> list[dict[str, Any]]:
        return [r for r in self.rows[table] if all(r[k] == v for k, v in eq.items())]

    def open_deals(self, account_id: str | None = None) -> list[dict[str, Any]]:
        deals = (
            self.rows["deals"] if account_id is None else self.where("deals", account_id=account_id)
        )
        return [d for d in deals if d["stage"] in OPEN_STAGES]


def _name(contact: dict[str, Any]) -> str:
    return f"{contact['first_name']} {contact['last_name']}"


def _label(stage: str) -> str:
    return stage.replace("_", " ")


def _scenario(prompt: str, updates=(), inserts=(), mentions=()) -> Scenario:
    return {
        "prompt": prompt,
        "expected": {"updates": list(updates), "inserts": list(inserts)},
        "mentions": [str(m) for m in mentions],
    }


# ------------------------------------------------------------------ level 1: lookups


def _contact_email(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    c = rng.choice(db.rows["contacts"])
    same = [x for x in db.where("contacts", account_id=c["account_id"]) if _name(x) == _name(c)]
    if len(same) > 1:
        return None
    acc = db.account[c["account_id"]]["name"]
    return _scenario(f"What is the email address of {_name(c)} at {acc}?", mentions=[c["email"]])


def _deal_stage(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    d = rng.choice(db.rows["deals"])
    acc = db.account[d["account_id"]]["name"]
    return _scenario(
        f'Which stage is the {acc} deal "{d["name"]}" in?', mentions=[_label(d["stage"])]
    )


def _account_owner(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    a = rng.choice(db.rows["accounts"])
    return _scenario(f"Who is the account owner of {a['name']}?", mentions=[a["owner"]])


def _open_tickets(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    a = rng.choice(db.rows["accounts"])
    n = sum(t["status"] != "closed" for t in db.where("tickets", account_id=a["id"]))
    return _scenario(
        f"How many support tickets of {a['name']} are not closed yet? Reply with the number.",
        mentions=[n],
    )


# ------------------------------------------------------------------ level 2: one update


def _move_stage(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    d = rng.choice(db.open_deals())
    later = STAGES[STAGES.index(d["stage"]) + 1 :]  # forward moves only, as sales do
    target = rng.choice(later)
    acc = db.account[d["account_id"]]["name"]
    return _scenario(
        f'Move the {acc} deal "{d["name"]}" to the {_label(target)} stage.',
        updates=[{"table": "deals", "id": d["id"], "set": {"stage": target}}],
    )


def _close_ticket(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    open_tickets = [t for t in db.rows["tickets"] if t["status"] != "closed"]
    if not open_tickets:
        return None
    t, res = rng.choice(open_tickets), rng.choice(_RESOLUTIONS)
    return _scenario(
        f'Close ticket {t["id"]} ("{t["subject"]}") with the resolution "{res}".',
        updates=[
            {
                "table": "tickets",
                "id": t["id"],
                "set": {"status": "closed", "resolution": {"contains": res}},
            }
        ],
    )


def _log_call(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    c, subject = rng.choice(db.rows["contacts"]), rng.choice(_CALL_SUBJECTS)
    acc = db.account[c["account_id"]]
    match = {"account_id": acc["id"], "contact_id": c["id"], "type": "call"}
    match["subject"] = {"contains": subject}
    return _scenario(
        f'Log a call with {_name(c)} of {acc["name"]}, with the subject "{subject}".',
        inserts=[{"table": "activities", "match": match, "count": 1}],
    )


def _create_ticket(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    acc, subject = rng.choice(db.rows["accounts"]), rng.choice(TICKET_SUBJECTS)
    priority = rng.choice(("low", "high", "urgent"))
    match = {"account_id": acc["id"], "priority": priority, "status": "open"}
    match["subject"] = {"contains": subject}
    return _scenario(
        f"Open {'an' if priority == 'urgent' else 'a'} {priority} priority support ticket "
        f'for {acc["name"]} with the subject "{subject}".',
        inserts=[{"table": "tickets", "match": match, "count": 1}],
    )


# ------------------------------------------------------------------ level 3: several updates


def _win_and_thank(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    d = rng.choice(db.open_deals())
    primary = db.where("contacts", account_id=d["account_id"], is_primary=1)[0]
    amount = max(500, round(d["amount"] * rng.choice((0.9, 1.1, 1.2)) / 500) * 500)
    if amount == d["amount"]:
        return None
    acc = db.account[d["account_id"]]["name"]
    return _scenario(
        f'We won the {acc} deal "{d["name"]}" at ${amount:,}. Mark it closed won with that '
        f"amount and email {_name(primary)}, the primary contact, to thank them.",
        updates=[
            {"table": "deals", "id": d["id"], "set": {"stage": "closed_won", "amount": amount}}
        ],
        inserts=[{"table": "emails", "match": {"to_contact_id": primary["id"]}, "count": 1}],
    )


def _close_urgent(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    acc = rng.choice(db.rows["accounts"])
    hot = [
        t
        for t in db.where("tickets", account_id=acc["id"])
        if t["status"] != "closed" and t["priority"] in ("high", "urgent")
    ]
    if not hot:
        return None
    res = rng.choice(_RESOLUTIONS)
    return _scenario(
        f"Close every ticket of {acc['name']} that is not closed and has high or urgent "
        f'priority, with the resolution "{res}". Then tell me how many tickets you closed.',
        updates=[
            {
                "table": "tickets",
                "id": t["id"],
                "set": {"status": "closed", "resolution": {"contains": res}},
            }
            for t in hot
        ],
        mentions=[len(hot)],
    )


def _deal_and_note(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    acc = rng.choice(db.rows["accounts"])
    name = (
        f"{acc['name'].split()[0]} {rng.choice(('Q3 Upsell', 'Data Migration', 'Security Audit'))}"
    )
    if any(d["name"].lower() == name.lower() for d in db.where("deals", account_id=acc["id"])):
        return None
    amount = rng.randint(10, 200) * 500
    close = TODAY.replace(day=1).replace(month=TODAY.month + rng.randint(1, 6)).isoformat()
    subject = rng.choice(("Kickoff planned", "Scope agreed", "Budget confirmed"))
    deal = {"account_id": acc["id"], "name": name, "amount": amount, "close_date": close}
    note = {"account_id": acc["id"], "type": "note", "deal_id": {"present": True}}
    note["subject"] = {"contains": subject}
    return _scenario(
        f'Create a deal named "{name}" for {acc["name"]} worth ${amount:,} with close date '
        f'{close}, then log a note on that deal with the subject "{subject}".',
        inserts=[
            {"table": "deals", "match": {**deal, "stage": "prospecting"}, "count": 1},
            {"table": "activities", "match": note, "count": 1},
        ],
    )


# ------------------------------------------------------------------ level 4: conditions


def _conditional_stage(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    early = [d for d in db.open_deals() if d["stage"] in ("prospecting", "qualification")]
    if not early:
        return None
    d = rng.choice(early)
    target = "negotiation" if d["amount"] >= 50_000 else "proposal"
    acc = db.account[d["account_id"]]["name"]
    return _scenario(
        f'Check the {acc} deal "{d["name"]}": if its amount is at least $50,000, move it to '
        "the negotiation stage, otherwise to the proposal stage. Tell me which stage you chose.",
        updates=[{"table": "deals", "id": d["id"], "set": {"stage": target}}],
        mentions=[target],
    )


def _discount(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    d = rng.choice(db.open_deals())
    acc = db.account[d["account_id"]]
    new = d["amount"] * (100 - DISCOUNTS[acc["tier"]]) // 100
    return _scenario(
        f"Apply the largest discount our discount policy allows to the {acc['name']} deal "
        f'"{d["name"]}" (see the knowledge base), and tell me the new amount.',
        updates=[{"table": "deals", "id": d["id"], "set": {"amount": new}}],
        mentions=[new],
    )


def _overdue_lost(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    acc = rng.choice(db.rows["accounts"])
    overdue = [d for d in db.open_deals(acc["id"]) if d["close_date"] < TODAY.isoformat()]
    if not overdue:
        return None
    return _scenario(
        f"Mark every open deal of {acc['name']} whose close date has already passed as "
        "closed lost. Leave its other deals alone.",
        updates=[
            {"table": "deals", "id": d["id"], "set": {"stage": "closed_lost"}} for d in overdue
        ],
    )


Template = Callable[[random.Random, ScenarioDb], Scenario | None]
"""Draws one scenario from a start database, or None where it has no eligible entity."""

TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (_contact_email, _deal_stage, _account_owner, _open_tickets),
    2: (_move_stage, _close_ticket, _log_call, _create_ticket),
    3: (_win_and_thank, _close_urgent, _deal_and_note),
    4: (_conditional_stage, _discount, _overdue_lost),
}


_DB_CACHE: dict[tuple[int, str], ScenarioDb] = {}


def make_scenario(
    rng: random.Random,
    levels: tuple[int, ...],
    db_seed: int,
    size: str,
    templates: Mapping[int, tuple[Template, ...]] = TEMPLATES,
) -> Scenario:
    """One scenario from a template of one of `levels` (of `templates`, crm-v1's by
    default), on database `(db_seed, size)`."""
    db = _DB_CACHE.get((db_seed, size))
    if db is None:
        db = _DB_CACHE.setdefault((db_seed, size), ScenarioDb(db_seed, size))
    for _ in range(200):  # a template without an eligible entity is redrawn
        level = rng.choice(levels)
        template = rng.choice(templates[level])
        scenario = template(rng, db)
        if scenario is not None:
            return {"template": template.__name__.lstrip("_"), "level": level, **scenario}
    raise RuntimeError(f"crm-v1: no scenario for levels {levels} on database {db_seed}/{size}")
