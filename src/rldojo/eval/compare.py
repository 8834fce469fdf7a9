"""Stages of a recipe compared on the same held-out tasks, task by task.

A run's evaluation writes one line per held-out task (`RUN/evals/LABEL.jsonl`: task id,
passed, ...). Two evaluations of the same greedy tasks pair by task id, which makes a
small difference measurable: the paired tests of `rldojo.eval.stats` look at the tasks
on which the two disagree. `rldojo pipeline` (`rldojo.training.pipeline`) and
`benchmarks/agentic_pool.py` report with these:

- `read_outcomes(run_dir, label)`: `{task id: passed}` of one evaluation, or None.
- `success_rate(outcomes)`: passed / n with its Wilson 95% interval.
- `paired_comparison(a, b)`: exact McNemar and the paired bootstrap of `b - a` on the
  tasks both evaluated.
- `by_kind(kinds, stages)`: passed/total per kind of task (e.g. a game's mark), per stage:
  whether a gain is a skill learned or a shift between kinds.
- `summary_pairs(summary)` and `pool_pairs(runs)`: replications of a pipeline (seeds)
  pooled. A pipeline summary's pass counts and McNemar cells fix its whole 2x2 table of
  per-task outcomes, so the pooled comparison is the same paired statistics over all the
  tables' tasks together (each seed has its own test tasks: the pooled tasks are
  independent).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rldojo.eval.harness import wilson_interval
from rldojo.eval.stats import mcnemar, paired_bootstrap

__all__ = ["Outcomes", "by_kind", "paired_comparison", "pool_pairs", "read_outcomes",
           "success_rate", "summary_pairs"]  # fmt: skip

Outcomes = dict[str, bool]
"""Whether each held-out task passed, by task id."""


def read_outcomes(run_dir: Path, label: str) -> Outcomes | None:
    """Per-task outcomes of the evaluation `label` ("before", "after", "step_N") of the
    run in `run_dir`; None when the run did not make it (e.g. `eval.before = false`)."""
    path = run_dir / "evals" / f"{label}.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["task_id"]: bool(r["passed"]) for r in rows}


def success_rate(outcomes: Mapping[str, bool] | None) -> dict[str, Any] | None:
    """`{"passed", "n", "rate", "ci95": [lo, hi]}` (Wilson); None for None."""
    if outcomes is None:
        return None
    k, n = sum(outcomes.values()), len(outcomes)
    lo, hi = wilson_interval(k, n)
    return {"passed": k, "n": n, "rate": k / max(n, 1), "ci95": [lo, hi]}


def paired_comparison(
    a: Mapping[str, bool] | None, b: Mapping[str, bool] | None
) -> dict[str, Any] | None:
    """`b` against `a` on the tasks both hold: `n`, `diff` (rate of b - rate of a) with
    its paired-bootstrap interval and p-value, and the exact McNemar test (`a_only`:
    tasks only `a` passed). None when either is None."""
    if a is None or b is None:
        return None
    common = sorted(set(a) & set(b))
    xa, xb = [a[t] for t in common], [b[t] for t in common]
    m = mcnemar(xa, xb)
    boot = paired_bootstrap([float(x) for x in xa], [float(x) for x in xb], seed=0)
    return {
        "n": len(common),
        "diff": boot.diff,
        "diff_ci95": list(boot.ci),
        "bootstrap_p": boot.p_value,
        "mcnemar": {"a_only": m.a_only, "b_only": m.b_only, "p_value": m.p_value},
    }


def by_kind(
    kinds: Mapping[str, str], stages: Mapping[str, Mapping[str, bool] | None]
) -> dict[str, dict[str, str]]:
    """`{stage: {kind: "passed/total"}}` for each stage with outcomes; `kinds` maps a task
    id to its kind (a task it lacks counts as "?")."""
    out: dict[str, dict[str, str]] = {}
    for stage, outcomes in stages.items():
        if outcomes is None:
            continue
        counts: dict[str, list[int]] = {}
        for task_id, passed in outcomes.items():
            c = counts.setdefault(kinds.get(task_id, "?"), [0, 0])
            c[0], c[1] = c[0] + passed, c[1] + 1
        out[stage] = {k: f"{v[0]}/{v[1]}" for k, v in sorted(counts.items())}
    return out


def summary_pairs(summary: Mapping[str, Any]) -> list[tuple[bool, bool]]:
    """The (SFT passed, SFT+RL passed) pair of every test task of one pipeline summary
    (`rldojo.training.pipeline`), in cell order, from its pass counts and McNemar cells.
    Raises `ValueError` when they disagree."""
    s, m = summary["success"], summary["paired"]["sft_to_sft_rl"]["mcnemar"]
    n, sft, rl = s["sft"]["n"], s["sft"]["passed"], s["sft_rl"]["passed"]
    both = sft - m["a_only"]
    if both < 0 or both + m["b_only"] != rl or both + m["a_only"] + m["b_only"] > n:
        raise ValueError("pass counts and McNemar cells disagree")
    cells = [(True, True)] * both + [(True, False)] * m["a_only"] + [(False, True)] * m["b_only"]
    return cells + [(False, False)] * (n - len(cells))


def pool_pairs(runs: Mapping[str, Sequence[tuple[bool, bool]]]) -> dict[str, Any]:
    """SFT and SFT+RL success and their paired comparison over the tasks of every run
    together (`runs`: a name per run, e.g. its file, and its `summary_pairs`)."""
    sft: Outcomes = {}
    rl: Outcomes = {}
    for name, pairs in runs.items():
        for i, (a, b) in enumerate(pairs):
            sft[f"{name}:{i}"], rl[f"{name}:{i}"] = a, b
    return {
        "sft": success_rate(sft),
        "sft_rl": success_rate(rl),
        "sft_to_sft_rl": paired_comparison(sft, rl),
    }
