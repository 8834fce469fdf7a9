"""`rldojo curate`: keep the tasks the model solves sometimes, with their pass-rate estimates.

    rldojo curate --data tasks.jsonl --model M --samples 8 [--band "(0,1)"] [--rounds 2]
                  [--dedup-against seen.jsonl] --out kept.jsonl

Without `--data`, the tasks are the `--env` environment's `--split` split. Near-duplicates
of the `--dedup-against` files (and of earlier tasks in the set) are dropped first, so no
model calls are spent on them. Every kept row carries `pass_rate`, `samples`, `passes`
and `mean_reward`; `--estimates` writes every task's estimate, `--plot` a histogram PNG,
`--report` a JSON summary (see `rldojo.eval.curate`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from rldojo.envs.base import Env


def register(app: typer.Typer) -> None:
    app.command("curate")(curate)


def _env_factory(env: str, kwargs: dict[str, Any], data: Path | None) -> Callable[[str], Env]:
    from rldojo.envs.registry import make_env

    def env_for(env_id: str) -> Env:
        extra = dict(kwargs) if env_id == env else {}
        if env_id == "math-v1" and data is not None and not {"path", "hf_dataset"} & set(extra):
            extra["path"] = str(data)  # math-v1 needs a file: the one being curated
        return make_env(env_id, **extra)

    return env_for


def _tasks(o: dict[str, Any], env_for: Callable[[str], Env]) -> list[Any]:
    from rldojo.eval.curate import load_tasks

    if o["data"] is not None:
        return load_tasks(o["data"], o["env"], env_for)
    return list(env_for(o["env"]).tasks(o["split"], seed=o["seed"], n=o["tasks"]))


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")


def curate(
    data: Annotated[Path | None, typer.Option(help="Task file (JSONL/JSON/Parquet)")] = None,
    model: Annotated[str, typer.Option(help="Model that estimates pass rates")] = (
        "smollm2-135m-instruct"
    ),
    env: Annotated[str, typer.Option(help="Environment for rows without 'env'")] = "arith-v1",
    env_kwargs: Annotated[str, typer.Option(help="JSON kwargs for that environment")] = "{}",
    samples: Annotated[int, typer.Option(help="Samples per task (K)")] = 8,
    band: Annotated[str, typer.Option(help="Kept pass rates, e.g. '(0,1)' or '[0.1,0.7]'")] = (
        "(0,1)"
    ),
    rounds: Annotated[int, typer.Option(help="Sample in rounds; stop decided tasks")] = 1,
    tasks: Annotated[int, typer.Option(help="Tasks drawn from --env without --data")] = 256,
    split: Annotated[str, typer.Option()] = "train",
    max_new_tokens: Annotated[int, typer.Option()] = 48,
    temperature: Annotated[float, typer.Option(help="Sampling temperature")] = 0.7,
    seed: Annotated[int, typer.Option()] = 0,
    dedup_against: Annotated[
        list[Path] | None, typer.Option(help="Drop near-duplicates of these task files")
    ] = None,
    ngram: Annotated[int, typer.Option(help="Word n-gram size for near-duplicates")] = 8,
    overlap: Annotated[float, typer.Option(help="N-gram containment that is a duplicate")] = 0.5,
    out: Annotated[Path, typer.Option(help="Kept tasks (JSONL)")] = Path("curated.jsonl"),
    estimates: Annotated[Path | None, typer.Option(help="Every task's estimate")] = None,
    plot: Annotated[Path | None, typer.Option(help="Pass-rate histogram PNG")] = None,
    report: Annotated[Path | None, typer.Option(help="Summary JSON")] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (1 helps on a busy machine)")
    ] = None,
) -> None:
    """Estimate pass rates with K samples per task and keep the tasks inside a band."""
    from rldojo.commands.evaluation import set_threads
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.eval.curate import Band

    set_threads(threads)
    o = dict(locals())
    errors: tuple[type[Exception], ...] = (
        *user_errors(),
        ValueError,
        FileNotFoundError,
        json.JSONDecodeError,
    )
    try:
        o["band"] = Band.parse(band)
        summary = _run(o, console)
    except errors as exc:
        fail(str(exc))
        return
    if report is not None:
        report.write_text(json.dumps(summary, indent=2))


def _run(o: dict[str, Any], console: Console) -> dict[str, Any]:
    from rldojo.data.dedup import dedup_tasks
    from rldojo.eval.curate import estimate_pass_rates, task_row
    from rldojo.policy.models import load_model
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.types import SamplingParams

    env_for = _env_factory(o["env"], json.loads(o["env_kwargs"]), o["data"])
    all_tasks = _tasks(o, env_for)
    reference = [text for path in o["dedup_against"] or [] for text in _texts(path)]
    tasks, removed = dedup_tasks(all_tasks, reference, n=o["ngram"], threshold=o["overlap"])
    console.print(f"{len(all_tasks)} tasks; {len(removed)} near-duplicates removed")
    model, tokenizer = load_model(o["model"])
    policy = TransformersPolicy(model, tokenizer)
    sampling = SamplingParams(o["max_new_tokens"], o["temperature"])
    found = asyncio.run(
        estimate_pass_rates(
            tasks,
            policy,
            env_for,
            sampling,
            samples=o["samples"],
            band=o["band"],
            rounds=o["rounds"],
            seed=o["seed"],
        )
    )
    rows = [
        task_row(
            e.task,
            pass_rate=e.rate,
            samples=e.samples,
            passes=e.passes,
            failed=e.failed,
            mean_reward=e.mean_reward,
        )
        for e in found
    ]
    kept = [
        row
        for row, e in zip(rows, found, strict=True)
        if e.rate is not None and o["band"].contains(e.rate)
    ]
    _write_rows(o["out"], kept)
    if o["estimates"] is not None:
        _write_rows(o["estimates"], rows)
    summary = _summary(o, found, kept, removed)
    _print(console, o, summary)
    if o["plot"] is not None:
        from rldojo.eval.plots import pass_rate_histogram

        rates = [e.rate for e in found if e.rate is not None]
        pass_rate_histogram(rates, o["plot"], band=(o["band"].low, o["band"].high))
    return summary


def _texts(path: Path) -> list[str]:
    from rldojo.eval.curate import load_texts

    return load_texts(path)


def _summary(
    o: dict[str, Any], found: list[Any], kept: list[Any], removed: list[Any]
) -> dict[str, Any]:
    from rldojo.eval.curate import histogram

    band = o["band"]
    rates = [e.rate for e in found if e.rate is not None]
    drawn = sum(e.drawn for e in found)
    return {
        "model": o["model"],
        "band": str(band),
        "tasks": len(found) + len(removed),
        "duplicates_removed": len(removed),
        "estimated": len(found),
        "kept": len(kept),
        "too_hard": sum(r < band.low or (r == band.low and not band.include_low) for r in rates),
        "too_easy": sum(r > band.high or (r == band.high and not band.include_high) for r in rates),
        "no_estimate": sum(e.rate is None for e in found),
        "failed_samples": sum(e.failed for e in found),
        "samples_drawn": drawn,
        "samples_saved": len(found) * o["samples"] - drawn,
        "mean_pass_rate": sum(rates) / len(rates) if rates else None,
        "histogram": histogram(found),
        "out": str(o["out"]),
    }


def _print(console: Console, o: dict[str, Any], s: dict[str, Any]) -> None:
    from rldojo.eval.curate import histogram_text

    console.print("pass-rate distribution (tasks per passes/K):")
    console.print(histogram_text(s["histogram"]), highlight=False)
    console.print(
        f"kept {s['kept']}/{s['estimated']} in band {s['band']} (too hard {s['too_hard']}, "
        f"too easy {s['too_easy']}, no estimate {s['no_estimate']}); "
        f"{s['samples_drawn']} samples drawn, {s['samples_saved']} saved by early stop, "
        f"{s['failed_samples']} failed -> {o['out']}"
    )
