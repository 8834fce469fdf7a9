"""Noise ceilings: the best score a benchmark with label errors allows, and adjusted scores.

Each item i has a probability e_i that its reference label is wrong: 1 or 0 when errors
are known, a suspicion in between, or an estimate from the disagreement of strong graders
(`estimate_label_errors`). With mean error rate ē over n items:

- ceiling = 1 - ē: a model that is always *truly* right still fails the mislabelled items.
- adjusted accuracy a, the estimate of accuracy against the true labels, solves
  E[observed] = (1 - ē)·a + ē·(1 - a)·c, where c is the chance that a wrong answer
  happens to match a wrong label (0 for free-form answers, about 1/(options - 1) for
  multiple choice):  a = (observed - c·ē) / (1 - ē - c·ē), clipped to [0, 1].
- relative = observed / ceiling: the share of the attainable score reached.

Intervals resample items (with their e_i) by the bootstrap. The file format of
`load_label_errors` is one JSON object per item: ``{"task_id": ..., "p_error": 0.9}``, or
``"mislabeled": true``, or ``"votes": [answers of strong graders]``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rldojo.data.loading import DataError, read_rows
from rldojo.graders.rules import normalize_answer

__all__ = ["NoiseCeiling", "estimate_label_errors", "load_label_errors", "noise_ceiling"]


@dataclass(frozen=True)
class NoiseCeiling:
    """Observed, ceiling, adjusted and relative scores (see the module docstring)."""

    n: int
    expected_errors: float
    observed: float
    ceiling: float
    adjusted: float
    adjusted_ci95: tuple[float, float]
    relative: float
    clean_accuracy: float
    clean_n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _adjusted(observed: np.ndarray, err: np.ndarray, chance: float) -> np.ndarray:
    """Adjusted accuracy per row of [R, N] outcome and error arrays -> [R]."""
    obs, e = observed.mean(axis=-1), err.mean(axis=-1)  # [R], [R]
    denom = 1.0 - e - chance * e  # [R]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(denom > 0, (obs - chance * e) / denom, np.nan)  # [R]
    return np.clip(a, 0.0, 1.0)


def noise_ceiling(
    outcomes: Mapping[str, bool],
    p_error: Mapping[str, float],
    *,
    chance: float = 0.0,
    n_resamples: int = 2000,
    seed: int = 0,
) -> NoiseCeiling:
    """Ceiling and noise-adjusted score of `outcomes` (task id -> passed).

    Items missing from `p_error` are taken as correctly labelled. `clean_accuracy` is the
    accuracy over items with e_i < 0.5 (not suspected).
    """
    if not 0.0 <= chance < 1.0:
        raise ValueError(f"chance must be in [0, 1), got {chance}")
    ids = sorted(outcomes)
    if not ids:
        raise ValueError("no outcomes")
    x = np.array([float(outcomes[t]) for t in ids])  # [N]
    e = np.array([float(p_error.get(t, 0.0)) for t in ids])  # [N]
    if ((e < 0) | (e > 1)).any():
        raise ValueError("label-error probabilities must be in [0, 1]")
    idx = np.random.default_rng(seed).integers(0, len(ids), size=(n_resamples, len(ids)))
    boot = _adjusted(x[idx], e[idx], chance)  # [R]
    boot = boot[~np.isnan(boot)]
    lo, hi = np.quantile(boot, [0.025, 0.975]) if boot.size else (math.nan, math.nan)
    clean = e < 0.5
    ceiling = 1.0 - float(e.mean())
    return NoiseCeiling(
        n=len(ids),
        expected_errors=float(e.sum()),
        observed=float(x.mean()),
        ceiling=ceiling,
        adjusted=float(_adjusted(x[None], e[None], chance)[0]),
        adjusted_ci95=(float(lo), float(hi)),
        relative=float(x.mean()) / ceiling if ceiling > 0 else math.nan,
        clean_accuracy=float(x[clean].mean()) if clean.any() else math.nan,
        clean_n=int(clean.sum()),
    )


def estimate_label_errors(
    references: Mapping[str, str | None],
    votes: Mapping[str, Sequence[str | None]],
    *,
    min_votes: int = 2,
    mode: str = "share",
    agreement: float = 0.5,
) -> dict[str, float]:
    """Label-error probabilities from the answers of strong graders (models or people).

    Answers are compared after `normalize_answer`. `share`: e_i is the share of votes
    that disagree with the reference. `majority`: e_i = 1 when the most common vote
    differs from the reference and more than `agreement` of the votes give it, else 0.
    Items with fewer than `min_votes` non-empty votes, or no reference, get no estimate.
    """
    if mode not in ("share", "majority"):
        raise ValueError(f"mode must be 'share' or 'majority', got {mode!r}")
    out: dict[str, float] = {}
    for task_id, answers in votes.items():
        ref = references.get(task_id)
        given = [normalize_answer(a) for a in answers if a is not None and a.strip()]
        if ref is None or len(given) < min_votes:
            continue
        gold = normalize_answer(ref)
        if mode == "share":
            out[task_id] = sum(a != gold for a in given) / len(given)
        else:
            top = max(set(given), key=given.count)
            out[task_id] = float(top != gold and given.count(top) / len(given) > agreement)
    return out


def load_label_errors(
    path: str | os.PathLike[str], references: Mapping[str, str | None] | None = None
) -> dict[str, float]:
    """Label-error probabilities from a file (see the module docstring for the rows).

    Rows with ``votes`` need `references` (task id -> reference answer).
    """
    source = os.fspath(path)
    out: dict[str, float] = {}
    votes: dict[str, list[str | None]] = {}
    for line, row in read_rows(source):
        task_id = row.get("task_id", row.get("id"))
        if not isinstance(task_id, str | int):
            raise DataError(source, line, "field 'task_id': missing")
        key = str(task_id)
        if "p_error" in row:
            p = row["p_error"]
            if not isinstance(p, int | float) or isinstance(p, bool) or not 0 <= p <= 1:
                raise DataError(source, line, f"field 'p_error': expected 0..1, got {p!r}")
            out[key] = float(p)
        elif "mislabeled" in row:
            out[key] = float(bool(row["mislabeled"]))
        elif isinstance(row.get("votes"), list):
            votes[key] = [None if v is None else str(v) for v in row["votes"]]
        else:
            raise DataError(source, line, "need one of 'p_error', 'mislabeled' or 'votes'")
    if votes:
        if references is None:
            raise DataError(source, None, "rows with 'votes' need the tasks' reference answers")
        out |= estimate_label_errors(references, votes)
    return out
