"""Judge meta-evaluation: does the judge agree with people, and is it biased?

`rldojo eval-judge --grader SPEC --labels labeled.jsonl` runs `evaluate_judge`. Rows are
the offline-grading rows plus a human ``label``: ``pass``/``fail`` (or true/false, 1/0),
or any label of a `label_model` grader.

Agreement: the judge's verdict per row (``pass`` when the score reaches the pass
threshold, else ``fail``; a label grader's own label when the human labels are not
pass/fail) against the human label: accuracy, Cohen's κ and the confusion matrix. Rows
the judge failed to score are counted (`coverage`) and left out, never guessed.

Bias probes:
    length     each sample is graded again with content-free padding appended (about
               doubling it); a fair judge's scores do not move. Reports the mean score
               change, how often the longer copy scored higher / lower, and verdict flips.
    position   (group judges) each group of samples that share an item is judged in
               forward and reversed order; reports the mean absolute score change and the
               first-position advantage (score when shown first minus when shown last).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from rldojo.data.loading import DataError, read_rows
from rldojo.graders.base import Grader, judges_groups
from rldojo.graders.offline import GradeRow, grade_rows, read_grade_rows, row_task_rollout
from rldojo.types import Score

__all__ = [
    "PADDING",
    "Agreement",
    "agreement",
    "cohen_kappa",
    "evaluate_judge",
    "length_bias",
    "normalise_label",
    "position_bias",
    "read_labels",
]

PADDING = (
    "I have considered this question carefully and thoroughly, and the answer above "
    "reflects that careful consideration in every respect. "
)
"""Content-free filler for the length probe."""

_TRUE = {"pass", "true", "yes", "1", "correct", "good"}
_FALSE = {"fail", "false", "no", "0", "incorrect", "bad"}


def normalise_label(value: object) -> str:
    """Booleans, 1/0 and yes/no style strings become ``pass``/``fail``; other strings stay."""
    if isinstance(value, bool):
        return "pass" if value else "fail"
    if isinstance(value, int | float):
        return "pass" if value >= 0.5 else "fail"
    text = str(value).strip().lower()
    if text in _TRUE:
        return "pass"
    if text in _FALSE:
        return "fail"
    return str(value).strip()


def cohen_kappa(pairs: Sequence[tuple[str, str]]) -> float | None:
    """Cohen's κ of two raters over `pairs`; None without pairs."""
    if not pairs:
        return None
    n = len(pairs)
    observed = sum(a == b for a, b in pairs) / n
    first, second = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    expected = sum(first[k] * second[k] for k in first) / (n * n)
    if expected >= 1.0:
        return 1.0 if observed >= 1.0 else 0.0
    return (observed - expected) / (1.0 - expected)


@dataclass(frozen=True)
class Agreement:
    rows: int
    scored: int
    coverage: float
    accuracy: float | None
    kappa: float | None
    labels: list[str]
    confusion: dict[str, dict[str, int]]
    """human label -> judge label -> count."""


def agreement(human: Sequence[str], judged: Sequence[str | None]) -> Agreement:
    pairs = [(h, j) for h, j in zip(human, judged, strict=True) if j is not None]
    labels = sorted({*human, *(j for _, j in pairs)})
    confusion = {h: {j: 0 for j in labels} for h in labels}
    for h, j in pairs:
        confusion[h][j] += 1
    return Agreement(
        rows=len(human),
        scored=len(pairs),
        coverage=len(pairs) / len(human) if human else 0.0,
        accuracy=sum(h == j for h, j in pairs) / len(pairs) if pairs else None,
        kappa=cohen_kappa(pairs),
        labels=labels,
        confusion=confusion,
    )


def read_labels(path: str, label_field: str = "label") -> tuple[list[GradeRow], list[str]]:
    """Offline-grading rows plus their normalised human labels."""
    rows = read_grade_rows(path)
    labels: dict[int, str] = {}
    for line, raw in read_rows(path):
        if raw.get(label_field) is None:
            raise DataError(path, line, f"field {label_field!r}: missing")
        labels[line] = normalise_label(raw[label_field])
    return rows, [labels[row.line] for row in rows]


def _verdict(score: Score, threshold: float, use_label: bool) -> str | None:
    if not score.ok or score.value is None:
        return None
    if use_label and "label" in score.provenance:
        return str(score.provenance["label"])
    return "pass" if score.value >= threshold else "fail"


def _padded(row: GradeRow) -> GradeRow:
    text = row.sample["output_text"]
    filler = PADDING * max(1, len(text) // len(PADDING) + 1)
    sample = {**row.sample, "output_text": f"{text}\n\n{filler.strip()}"}
    sample.pop("output_json", None)
    return replace(row, sample=sample)


async def length_bias(
    grader: Grader, rows: Sequence[GradeRow], base: Sequence[Score], threshold: float
) -> dict[str, Any]:
    """Score change when content-free padding doubles each sample (module docstring)."""
    padded = await grade_rows(grader, [_padded(r) for r in rows])
    deltas, flips_up, flips_down = [], 0, 0
    for before, after in zip(base, padded, strict=True):
        if not (before.ok and after.ok) or before.value is None or after.value is None:
            continue
        deltas.append(after.value - before.value)
        flips_up += before.value < threshold <= after.value
        flips_down += after.value < threshold <= before.value
    n = len(deltas)
    return {
        "pairs": n,
        "mean_delta": sum(deltas) / n if n else None,
        "longer_scored_higher": sum(d > 0 for d in deltas) / n if n else None,
        "longer_scored_lower": sum(d < 0 for d in deltas) / n if n else None,
        "flips_to_pass": flips_up,
        "flips_to_fail": flips_down,
    }


async def position_bias(grader: Grader, rows: Sequence[GradeRow]) -> dict[str, Any] | None:
    """Forward vs reversed presentation of each group (group judges only; else None)."""
    if not judges_groups(grader):
        return None
    groups: dict[str, list[int]] = defaultdict(list)
    pairs = [row_task_rollout(r, i) for i, r in enumerate(rows)]
    for i, (task, _) in enumerate(pairs):
        groups[task.id].append(i)
    diffs: list[float] = []
    first_advantage: list[float] = []
    for idx in (g for g in groups.values() if len(g) >= 2):
        task = pairs[idx[0]][0]
        rollouts = [pairs[i][1] for i in idx]
        forward = list(range(len(idx)))
        a, b = await asyncio.gather(
            grader.grade_group(rollouts, task, order=forward),
            grader.grade_group(rollouts, task, order=forward[::-1]),
        )
        ok = [i for i in forward if a[i].ok and b[i].ok]  # each holds a value
        va, vb = [s.value or 0.0 for s in a], [s.value or 0.0 for s in b]
        diffs += [abs(va[i] - vb[i]) for i in ok]
        last = len(idx) - 1
        if 0 in ok:
            first_advantage.append(va[0] - vb[0])
        if last in ok:
            first_advantage.append(vb[last] - va[last])
    return {
        "groups": sum(len(g) >= 2 for g in groups.values()),
        "mean_abs_change": sum(diffs) / len(diffs) if diffs else None,
        "first_position_advantage": (
            sum(first_advantage) / len(first_advantage) if first_advantage else None
        ),
    }


async def evaluate_judge(
    grader: Grader,
    rows: Sequence[GradeRow],
    human: Sequence[str],
    *,
    threshold: float = 1.0,
    probes: bool = True,
    concurrency: int = 8,
) -> dict[str, Any]:
    """Agreement with `human` labels, plus the bias probes (see the module docstring)."""
    scores = await grade_rows(grader, rows, concurrency=concurrency)
    use_label = not set(human) <= {"pass", "fail"}
    judged = [_verdict(s, threshold, use_label) for s in scores]
    report: dict[str, Any] = {"agreement": asdict(agreement(human, judged))}
    report["statuses"] = dict(Counter(s.status for s in scores))
    if probes:
        report["length_bias"] = await length_bias(grader, rows, scores, threshold)
        report["position_bias"] = await position_bias(grader, rows)
    return report
