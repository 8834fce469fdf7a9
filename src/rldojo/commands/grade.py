"""`rldojo grade` (grade a JSONL file of samples) and `rldojo eval-judge` (judge vs labels).

    rldojo grade --grader grader.json --data samples.jsonl --out scored.jsonl
    rldojo eval-judge --grader rubric.toml --labels labeled.jsonl --out report.json

Both read rows ``{"item": {...}, "sample": {"output_text": ...}}`` (see
`rldojo.graders.offline`); `eval-judge` rows also carry a human ``label``. Judge replies
are cached (`--cache`), so running either again costs no judge calls.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

if TYPE_CHECKING:
    from rich.console import Console

GraderOpt = Annotated[str, typer.Option("--grader", help="Grader spec: .json/.toml file or JSON")]
CacheOpt = Annotated[
    str | None,
    typer.Option(help="Judge cache file ('off' disables; default $RLDOJO_CACHE/judge.sqlite)"),
]
ConcurrencyOpt = Annotated[int, typer.Option(help="Rows graded at once")]
ThresholdOpt = Annotated[
    float | None, typer.Option(help="Pass threshold (default: the grader's, else 1.0)")
]


def register(app: typer.Typer) -> None:
    app.command("grade")(grade)
    app.command("eval-judge")(eval_judge)


def _cache(value: str | None) -> Any:
    if value is None:
        return None
    return False if value.lower() in ("off", "none", "false") else value


def grade(
    grader: GraderOpt,
    data: Annotated[Path, typer.Option(help="Rows to grade (.jsonl)")],
    out: Annotated[Path, typer.Option(help="Scored rows (.jsonl)")],
    summary: Annotated[
        Path | None, typer.Option(help="Summary JSON (default: OUT.summary.json)")
    ] = None,
    concurrency: ConcurrencyOpt = 8,
    cache: CacheOpt = None,
    pass_threshold: ThresholdOpt = None,
) -> None:
    """Grade a file of (item, sample) rows; write scored rows and a summary."""
    from rich.progress import Progress

    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.graders.offline import (
        check_row_templates,
        grade_rows,
        read_grade_rows,
        summarize,
        write_scored,
    )
    from rldojo.graders.specs.loading import load

    try:
        rows = read_grade_rows(data)
        spec_grader = load(grader, cache=_cache(cache))
        check_row_templates(spec_grader, rows, str(data))
    except user_errors() as exc:
        fail(str(exc))
        return
    threshold = spec_grader.pass_threshold if pass_threshold is None else pass_threshold

    async def run() -> tuple[list[Any], float]:
        started = time.perf_counter()
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task(f"grading {len(rows)} rows", total=len(rows))
            try:
                scores = await grade_rows(
                    spec_grader,
                    rows,
                    concurrency=concurrency,
                    on_done=lambda k: progress.advance(bar, k),
                )
            finally:
                await spec_grader.close()
        return scores, time.perf_counter() - started

    scores, wall_s = asyncio.run(run())
    write_scored(out, rows, scores)
    result = summarize(scores, pass_threshold=threshold, stats=spec_grader.stats(), wall_s=wall_s)
    target = summary or out.with_name(out.name + ".summary.json")
    target.write_text(json.dumps(result, indent=2) + "\n")
    _print_summary(console, result, out, target)
    _exit_if_all_failed(scores)


def _exit_if_all_failed(scores: list[Any]) -> None:
    """Exit 1 when no row was scored (every one `error`, `timeout` or `invalid`): an
    unreachable judge or a broken grader, not a result. The outputs are written first."""
    if not scores or any(s.ok for s in scores):
        return
    from rldojo.commands.ui import err_console

    first = next((s.explanation for s in scores if s.explanation), "")
    err_console.print(
        f"[red]error:[/] no row was scored ({len(scores)} failed); the first: "
        f"{escape(' '.join(first.split())[:300])}",
        soft_wrap=True,
    )
    raise typer.Exit(1)


def _print_summary(console: Console, result: dict[str, Any], out: Path, target: Path) -> None:
    mean = "n/a" if result["mean"] is None else f"{result['mean']:.3f}"
    rate = "n/a" if result["pass_rate"] is None else f"{result['pass_rate']:.1%}"
    console.print(
        f"{result['rows']} rows: mean {mean}, pass rate {rate} "
        f"(threshold {result['pass_threshold']:g}), statuses {result['statuses']}"
    )
    if result["components"]:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in result["components"].items())
        console.print(f"components: {parts}")
    if result["flags"]:
        console.print(f"flags: {result['flags']}")
    judge = result.get("judge")
    if judge and (judge["calls"] or judge["cache_hits"]):
        console.print(
            f"judge: {judge['calls']} calls, {judge['cache_hits']} cache hits "
            f"({judge['cache_hit_rate']:.0%}), {judge['failures']} failures"
        )
    console.print(f"{result.get('samples_per_s')} samples/s; wrote {out} and {target}")


def eval_judge(
    grader: GraderOpt,
    labels: Annotated[Path, typer.Option(help="Labelled rows (.jsonl) with a 'label' field")],
    out: Annotated[Path | None, typer.Option(help="Write the report as JSON")] = None,
    label_field: Annotated[str, typer.Option(help="Field holding the human label")] = "label",
    probes: Annotated[bool, typer.Option(help="Run the length and position bias probes")] = True,
    concurrency: ConcurrencyOpt = 8,
    cache: CacheOpt = None,
    pass_threshold: ThresholdOpt = None,
) -> None:
    """Agreement of a judge with human labels (accuracy, Cohen's kappa) and bias probes."""
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.graders.judges.meta_eval import evaluate_judge, read_labels
    from rldojo.graders.offline import check_row_templates
    from rldojo.graders.specs.loading import load

    try:
        rows, human = read_labels(str(labels), label_field)
        spec_grader = load(grader, cache=_cache(cache))
        check_row_templates(spec_grader, rows, str(labels))
    except user_errors() as exc:
        fail(str(exc))
        return
    threshold = spec_grader.pass_threshold if pass_threshold is None else pass_threshold

    async def run() -> dict[str, Any]:
        try:
            return await evaluate_judge(
                spec_grader,
                rows,
                human,
                threshold=threshold,
                probes=probes,
                concurrency=concurrency,
            )
        finally:
            await spec_grader.close()

    report = asyncio.run(run())
    stats = spec_grader.stats()
    report["judge"] = {"calls": stats.calls, "cache_hits": stats.cache_hits}
    agree = report["agreement"]
    acc = "n/a" if agree["accuracy"] is None else f"{agree['accuracy']:.1%}"
    kappa = "n/a" if agree["kappa"] is None else f"{agree['kappa']:.3f}"
    console.print(
        f"{agree['scored']}/{agree['rows']} rows scored: accuracy {acc}, Cohen's kappa {kappa}"
    )
    console.print(f"confusion (human -> judge): {agree['confusion']}")
    if probes:
        console.print(f"length bias: {report['length_bias']}")
        console.print(f"position bias: {report['position_bias'] or 'n/a (not a group judge)'}")
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
    if rows and not agree["scored"]:
        from rldojo.commands.ui import err_console

        err_console.print(
            f"[red]error:[/] the judge scored none of the {len(rows)} rows "
            f"(statuses {report['statuses']})",
            soft_wrap=True,
        )
        raise typer.Exit(1)
