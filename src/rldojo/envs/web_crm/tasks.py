"""web-crm-v1's task templates: crm-v1's scenarios, regrouped by horizon in the browser.

A task is a crm-v1 scenario (`rldojo.envs.crm.scenarios`: the request, the expected
updates and inserts, the facts to mention), so the CRM grader scores the end state of the
web application's database exactly as it scores crm-v1's. What changes is the grouping:
in a browser a task's length is the number of page actions, so the four levels are
horizons (typical expert actions in brackets):

1. look a value up on a detail page [4]: a contact's email, a deal's stage, an
   account's owner, the count of an account's open tickets;
2. change a field through an edit form, or close a ticket through its confirmation
   step [7-8]: move a deal's stage, close a ticket, the stage chosen by amount;
3. create records through forms, one of which the request makes fail first [8-15]: a
   deal whose close date the user gives in words (the form wants YYYY-MM-DD; the alert
   says so) and a note on it, a ticket, a logged call;
4. several records found through search and pages and acted on [8-21]: close every
   high or urgent ticket of an account, mark its overdue deals lost, win a deal and
   email the primary contact.
"""

from __future__ import annotations

import random
from datetime import date

from rldojo.envs.crm.scenarios import TEMPLATES, Scenario, ScenarioDb, Template

__all__ = ["LEVELS", "WEB_TEMPLATES"]

LEVELS = (1, 2, 3, 4)


def _crm(name: str) -> Template:
    """crm-v1's template of that name."""
    for templates in TEMPLATES.values():
        for template in templates:
            if template.__name__.lstrip("_") == name:
                return template
    raise KeyError(name)


def _in_words(iso: str) -> str:
    day = date.fromisoformat(iso)
    return f"{day:%B} {day.day}, {day.year}"


def _deal_and_note_in_words(rng: random.Random, db: ScenarioDb) -> Scenario | None:
    """crm-v1's deal_and_note with the close date in words: the form refuses it until
    it is typed as YYYY-MM-DD (the validation error the level is about)."""
    scenario = _crm("deal_and_note")(rng, db)
    if scenario is None:
        return None
    (deal,) = [x for x in scenario["expected"]["inserts"] if x["table"] == "deals"]
    iso = deal["match"]["close_date"]
    prompt = scenario["prompt"].replace(f"with close date {iso}", f"closing on {_in_words(iso)}")
    return {**scenario, "prompt": prompt}


WEB_TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: tuple(_crm(n) for n in ("contact_email", "deal_stage", "account_owner", "open_tickets")),
    2: tuple(_crm(n) for n in ("move_stage", "close_ticket", "conditional_stage")),
    3: (_deal_and_note_in_words, _crm("create_ticket"), _crm("log_call")),
    4: tuple(_crm(n) for n in ("close_urgent", "overdue_lost", "win_and_thank")),
}
"""The templates of each horizon level (see the module docstring)."""
