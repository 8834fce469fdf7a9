"""PNG plots for the data and evaluation reports (matplotlib, no display needed).

Each function draws one figure with `matplotlib.figure.Figure` (no pyplot global state,
no GUI backend) and writes it to `path`:

- `entropy_histogram`: token entropies on a log axis, with 0.01 and the 80th percentile;
- `sequence_entropy`: entropy along one sequence, forking tokens highlighted, tokens as text;
- `entropy_change`: mean entropy before and after training per initial-entropy bucket;
- `pass_rate_histogram`: the curation pass-rate distribution with the kept band;
- `robustness`: accuracy and interval per perturbation variant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "entropy_change",
    "entropy_histogram",
    "pass_rate_histogram",
    "robustness",
    "sequence_entropy",
]

_FLOOR = 1e-5
"""Entropies below this are drawn at it, so exact zeros show on the log axis."""


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def entropy_histogram(
    series: Mapping[str, np.ndarray], path: str | Path, *, title: str = "token entropy"
) -> Path:
    """Histogram of each named series of entropies (nats) on log-spaced bins."""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    top = max((float(v.max()) for v in series.values() if v.size), default=1.0)
    bins = np.logspace(np.log10(_FLOOR), np.log10(max(top, 0.1) * 1.05), 60)
    for name, values in series.items():
        ax.hist(np.clip(values, _FLOOR, None), bins=list(bins), alpha=0.55, label=name)
    first = next(iter(series.values()))
    ax.axvline(0.01, color="black", linestyle=":", label="0.01")
    if first.size:
        ax.axvline(float(np.quantile(first, 0.8)), color="red", linestyle="--", label="p80")
    ax.set_xscale("log")
    ax.set_xlabel("entropy (nats)")
    ax.set_ylabel("tokens")
    ax.set_title(title)
    ax.legend()
    return _save(fig, path)


def sequence_entropy(
    tokens: Sequence[str],
    entropies: Sequence[float],
    forking: Sequence[bool],
    path: str | Path,
    *,
    threshold: float | None = None,
    title: str = "entropy along a sequence",
) -> Path:
    """Bars of entropy per token; forking tokens in red, the token text under each bar."""
    n = len(tokens)
    fig = Figure(figsize=(max(7.5, 0.22 * n + 1), 4))
    ax = fig.add_subplot()
    colours = ["tab:red" if f else "tab:blue" for f in forking]
    ax.bar(range(n), entropies, color=colours)
    if threshold is not None:
        ax.axhline(threshold, color="red", linestyle="--", linewidth=0.8, label="top-ρ threshold")
        ax.legend()
    ax.set_xticks(range(n))
    ax.set_xticklabels([repr(t)[1:-1] for t in tokens], rotation=90, fontsize=7)
    ax.set_ylabel("entropy (nats)")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def entropy_change(
    buckets: Sequence[Mapping[str, Any]], path: str | Path, *, labels: tuple[str, str]
) -> Path:
    """Grouped bars: mean entropy of each model per bucket of the first model's entropy."""
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    x = np.arange(len(buckets))
    ax.bar(x - 0.2, [b["mean_base"] for b in buckets], width=0.4, label=labels[0])
    ax.bar(x + 0.2, [b["mean_new"] for b in buckets], width=0.4, label=labels[1])
    ax.set_xticks(x)
    ax.set_xticklabels([b["bucket"] for b in buckets])
    ax.set_xlabel(f"percentile bucket of {labels[0]} entropy")
    ax.set_ylabel("mean entropy (nats)")
    ax.legend()
    return _save(fig, path)


def pass_rate_histogram(
    rates: Sequence[float],
    path: str | Path,
    *,
    band: tuple[float, float] | None = None,
    bins: int = 11,
) -> Path:
    """Histogram of per-task pass rates; the kept band shaded."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    ax.hist(rates, bins=list(np.linspace(0.0, 1.0, bins + 1)), edgecolor="black")
    if band is not None:
        ax.axvspan(band[0], band[1], color="green", alpha=0.15, label="kept band")
        ax.legend()
    ax.set_xlabel("estimated pass rate")
    ax.set_ylabel("tasks")
    return _save(fig, path)


def robustness(variants: Mapping[str, Mapping[str, Any]], path: str | Path) -> Path:
    """Accuracy with its 95% interval for each perturbation variant."""
    names = list(variants)
    acc = np.array([variants[n]["accuracy"] for n in names])
    lo = np.array([variants[n]["ci95"][0] for n in names])
    hi = np.array([variants[n]["ci95"][1] for n in names])
    fig = Figure(figsize=(7, 0.4 * len(names) + 1.5))
    ax = fig.add_subplot()
    y = np.arange(len(names))
    ax.errorbar(acc, y, xerr=[acc - lo, hi - acc], fmt="o", capsize=3)
    ax.set_yticks(y)
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("accuracy")
    return _save(fig, path)
