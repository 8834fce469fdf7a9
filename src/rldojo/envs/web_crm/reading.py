"""Reading web-crm-v1's pages as text: element refs, tables, fields and alerts.

The scripted expert (`rldojo.envs.web_crm.expert`) reads the same text the model reads
(`rldojo.envs.web_crm.page_text`): ``[12] button "Save deal"`` for an element, ``| a |
b |`` for a table row (a title line, then a header row, then the rows), ``| Label |
value |`` for a record's field, and ``Alert:`` / ``Status:`` lines under the page line.
Anything it cannot find raises `NotOnPage`, which ends the expert's episode with a
plain answer saying what was missing.
"""

from __future__ import annotations

import re

__all__ = ["NotOnPage", "alert", "cell_ref", "cell_text", "field", "ref", "table"]

_LINK = re.compile(r'^\[(\d+)\] \w+ "(.*)"$')


class NotOnPage(Exception):
    """What the expert looked for is not on the page."""


def ref(page: str, role: str, name: str) -> int:
    """The ref of the element with this role and accessible name (case-insensitive)."""
    pattern = rf'\[(\d+)\] {re.escape(role)} "{re.escape(name)}"'
    match = re.search(pattern, page, re.IGNORECASE)
    if match is None:
        raise NotOnPage(f'I could not find the {role} "{name}" on the page.')
    return int(match.group(1))


def alert(page: str) -> str | None:
    """The page's alert text (a refused form), or None."""
    match = re.search(r"^Alert: (.*)$", page, re.MULTILINE)
    return match.group(1) if match else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split(" | ")]


def _is_row(line: str) -> bool:
    line = line.strip()
    return line.startswith("| ") and line.endswith(" |")


def table(page: str, title: str) -> list[dict[str, str]]:
    """The rows of the table under the line `title`, as {header: cell}; [] when the
    page says the table is empty, NotOnPage when there is no such table."""
    lines = page.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() == f"{title}: none.":
            return []
        if line.strip() != title or not _is_row(lines[i + 1]):
            continue
        header = _cells(lines[i + 1])
        rows = []
        for row in lines[i + 2 :]:
            if not _is_row(row):
                break
            rows.append(dict(zip(header, _cells(row), strict=False)))
        return rows
    raise NotOnPage(f"I could not find the {title} table on the page.")


def field(page: str, label: str) -> str:
    """The value of a record's field (a two-cell row ``| label | value |``)."""
    for line in page.splitlines():
        if _is_row(line):
            cells = _cells(line)
            if len(cells) == 2 and cells[0].lower() == label.lower():
                return cell_text(cells[1])
    raise NotOnPage(f"I could not find the {label} of the record.")


def cell_text(cell: str) -> str:
    """A cell's text: a link's name, or the cell itself."""
    match = _LINK.match(cell)
    return match.group(2) if match else cell


def cell_ref(cell: str) -> int:
    """The ref of the link in a cell."""
    match = _LINK.match(cell)
    if match is None:
        raise NotOnPage(f"{cell!r} is not a link.")
    return int(match.group(1))
