"""How `rldojo eval` shows its results: the console tables, the per-task rows and metrics
of `--out` (JSON), and `--report` (Markdown: the metrics table, the paired comparison,
robustness, the noise ceiling and the failure modes of each model)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from rldojo.eval.harness import SampledEval


def summary_table(title: str, summary: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=title)
    for column in ("metric", "value", "95% CI (bootstrap)", "95% CI (Wilson)", "tasks"):
        table.add_column(column)
    for name, m in summary.items():
        wilson = f"{m.wilson[0]:.3f} – {m.wilson[1]:.3f}" if m.wilson else ""
        table.add_row(name, f"{m.value:.3f}", f"{m.lo:.3f} – {m.hi:.3f}", wilson, str(m.n))
    return table


def task_rows(result: SampledEval, ks: list[int]) -> list[dict[str, Any]]:
    rows = []
    for t in result.tasks:
        row: dict[str, Any] = {
            "task_id": t.task_id,
            "answer": t.reference,
            "n": t.n,
            "passes": t.c,
            "statuses": t.statuses,
            "majority_correct": t.majority(),
            "mean_reward": t.mean_reward(),
            "completion": t.completions[0] if t.completions else "",
            "passed": bool(t.passes[0]) if t.passes else False,
        }
        row |= {f"pass@{k}": t.pass_at(k) for k in ks}
        rows.append(row)
    return rows


def metrics_json(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {"value": m.value, "ci95": [m.lo, m.hi], "wilson95": m.wilson, "tasks": m.n}
        for k, m in summary.items()
    }


def print_robustness(console: Console, report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"robustness ({report['tasks']} tasks)")
    for column in ("variant", "accuracy", "95% CI", "vs baseline"):
        table.add_column(column)
    for name, v in report["variants"].items():
        lo, hi = v["ci95"]
        table.add_row(
            name, f"{v['accuracy']:.3f}", f"{lo:.3f} – {hi:.3f}", f"{v['diff_vs_baseline']:+.3f}"
        )
    console.print(table)
    console.print(
        f"spread (max - min) {report['spread']:.3f}, std {report['std']:.3f}, "
        f"tasks that flip {len(report['flips'])} ({report['flip_rate']:.1%})"
    )


def markdown_report(data: dict[str, Any]) -> str:
    """The report of one evaluation (see the module docstring)."""
    lines = [f"# rldojo eval: {data['model']} on {data['env']}", ""]
    lines += ["| metric | value | 95% CI (bootstrap) | 95% CI (Wilson) | tasks |"]
    lines.append("|---|---:|---|---|---:|")
    for name, m in data["metrics"].items():
        w = f"{m['wilson95'][0]:.3f}–{m['wilson95'][1]:.3f}" if m["wilson95"] else ""
        ci = f"{m['ci95'][0]:.3f}–{m['ci95'][1]:.3f}"
        lines.append(f"| {name} | {m['value']:.3f} | {ci} | {w} | {m['tasks']} |")
    if "compare" in data:
        c = data["compare"]
        lines += [
            "",
            f"## {data['compare_model']} minus {data['model']}",
            "",
            f"avg@K difference {c['diff']:+.3f} (95% CI {c['diff_ci95'][0]:+.3f} to "
            f"{c['diff_ci95'][1]:+.3f}, paired bootstrap p={c['bootstrap_p']:.3g}); McNemar: "
            f"{c['mcnemar']['a_only']} tasks only A, {c['mcnemar']['b_only']} only B, "
            f"p={c['mcnemar']['p_value']:.3g}",
        ]
    if "robustness" in data:
        r = data["robustness"]
        lines += ["", "## Robustness", "", "| variant | accuracy | 95% CI |", "|---|---:|---|"]
        for name, v in r["variants"].items():
            lines.append(
                f"| {name} | {v['accuracy']:.3f} | {v['ci95'][0]:.3f}–{v['ci95'][1]:.3f} |"
            )
        lines.append(f"\nspread {r['spread']:.3f}; tasks that flip: {len(r['flips'])}")
    if "noise" in data:
        n = data["noise"]
        lines += [
            "",
            f"## Noise ceiling\n\nobserved {n['observed']:.3f}, ceiling {n['ceiling']:.3f}, "
            f"adjusted {n['adjusted']:.3f}, relative {n['relative']:.3f}",
        ]
    from rldojo.eval.failures import FailureGroup, failures_markdown

    for key, model in (
        ("failures", data["model"]),
        ("compare_failures", data.get("compare_model")),
    ):
        if key in data:
            groups = [FailureGroup(**g) for g in data[key]]
            lines += ["", f"## Failure modes: {model}", "", failures_markdown(groups)]
    return "\n".join([*lines, ""])
