"""`rldojo eval --report` and `rldojo entropy` outputs found under the served roots, as
HTML: the Markdown report (its tables: paired comparisons, intervals, forking-position
overlap) and the plots written beside it.

A report is a `*.md` file whose first line starts with `# rldojo ` (both commands write
that heading); its plots are the PNGs in the same directory named after it
(`report_robustness.png`) or, for an entropy report, `entropy_*.png`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import markdown

MAX_DEPTH = 5
"""How deep below a root reports are looked for."""

MAX_REPORT_BYTES = 2_000_000
"""A larger Markdown file is not rendered (it is not one of ours)."""


def heading(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
    except OSError:
        return None
    return first[2:] if first.startswith("# rldojo ") else None


def find_reports(roots: list[Path]) -> list[dict[str, Any]]:
    """Every report under the roots: id (index into roots + relative path) and title."""
    out: list[dict[str, Any]] = []
    for index, root in enumerate(r.resolve() for r in roots):
        todo = [(root, 0)]
        while todo:
            here, depth = todo.pop()
            try:
                entries = sorted(here.iterdir())
            except OSError:
                continue
            for p in entries:
                if p.name.startswith("."):
                    continue
                if not p.resolve().is_relative_to(root):
                    continue  # a symlink out of the root
                if p.is_dir() and depth < MAX_DEPTH:
                    todo.append((p, depth + 1))
                elif p.suffix == ".md" and (title := heading(p)):
                    rel = p.relative_to(root).as_posix()
                    out.append(
                        {
                            "id": f"{index}/{rel}",
                            "title": title,
                            "kind": title.split(":")[0].split()[-1],
                        }
                    )
    return sorted(out, key=lambda r: r["id"])


def resolve(roots: list[Path], report_id: str, suffix: str) -> Path | None:
    """The file a report id (or a plot id) names, if it is inside its root and has this
    suffix; None otherwise (unknown, `..`, a symlink out)."""
    head, _, rel = report_id.partition("/")
    if not head.isdigit() or int(head) >= len(roots) or not rel:
        return None
    root = roots[int(head)]
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or path.suffix != suffix or not path.is_file():
        return None
    return path


def plots(report: Path, report_id: str) -> list[str]:
    """Ids of the PNGs that belong to the report."""
    base = report_id.rsplit("/", 1)[0]  # "0/evals/report.md" -> "0/evals"; "0/r.md" -> "0"
    names = sorted(p.name for p in report.parent.glob("*.png"))
    mine = [n for n in names if n.startswith(f"{report.stem}_")]
    if (heading(report) or "").startswith("entropy"):
        mine += [n for n in names if n.startswith("entropy_") and n not in mine]
    return [f"{base}/{n}" for n in mine]


def render(path: Path) -> str:
    """The report's Markdown as HTML (tables included; raw HTML in it is escaped)."""
    if path.stat().st_size > MAX_REPORT_BYTES:
        return "<p>report too large to render</p>"
    text = path.read_text(encoding="utf-8", errors="replace")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return markdown.markdown(text, extensions=["tables", "fenced_code"])
