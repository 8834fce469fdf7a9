"""`rldojo entropy`: the token-entropy statistics of "Beyond the 80/20 Rule" for a model.

    rldojo entropy --model M --env arith-v1 [--compare TRAINED] [--ledger RUN_DIR]
                   [--prompts 64] [--samples 1] [--max-new-tokens 64] [--temperature 1.0]

Sequences are sampled from `--model` on the environment's tasks (or read from a run's
ledger with `--ledger`); entropies are then recomputed by a teacher-forced forward of
each model over the same tokens (`rldojo.training.entropy_analysis`). Writes to `--out`:
report.json, report.md, entropy_hist.png, entropy_sequence.png and, with `--compare`,
entropy_change.png.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer

if TYPE_CHECKING:
    import torch

    from rldojo.policy.base import Tokenizer
    from rldojo.types import Rollout


def register(app: typer.Typer) -> None:
    app.command("entropy")(entropy)


def _sequences(o: dict[str, Any], model: torch.nn.Module, tokenizer: Tokenizer) -> list[Rollout]:
    from rldojo.envs.registry import make_env
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.rollout.episodes import collect_rollouts
    from rldojo.training.entropy_analysis import sequences_from_ledger
    from rldojo.types import SamplingParams

    if o["ledger"] is not None:
        return sequences_from_ledger(o["ledger"], limit=o["prompts"] * o["samples"], step=o["step"])
    kwargs = json.loads(o["env_kwargs"])
    tasks = list(make_env(o["env"], **kwargs).tasks(o["split"], seed=o["seed"], n=o["prompts"]))
    requests = [(t, j, o["seed"] + i) for i, t in enumerate(tasks) for j in range(o["samples"])]
    sampling = SamplingParams(o["max_new_tokens"], o["temperature"], seed=o["seed"])
    policy = TransformersPolicy(model, tokenizer)
    rollouts = asyncio.run(
        collect_rollouts(lambda: make_env(o["env"], **kwargs), policy, requests, sampling)
    )
    return [r for r in rollouts if r.trainable]


def _typical_row(rollouts: list[Rollout], forking: torch.Tensor, rho: float) -> int:
    """A sequence whose share of forking tokens is closest to ρ (preferring 16+ tokens)."""

    def distance(i: int) -> tuple[bool, float]:
        n = max(sum(rollouts[i].policy_mask), 1)
        return (n < 16, abs(float(forking[i].sum()) / n - rho))

    return min(range(len(rollouts)), key=distance)


def _plots(
    o: dict[str, Any],
    tokenizer: Tokenizer,
    rollouts: list[Rollout],
    ents: list[list[np.ndarray]],
    report: dict[str, Any],
) -> list[Path]:
    from rldojo.eval import plots
    from rldojo.training.entropy_analysis import top_positions

    out: Path = o["out"]
    masks = [np.asarray(r.policy_mask, dtype=bool) for r in rollouts]
    series = {o["label"]: np.concatenate([e[m] for e, m in zip(ents[0], masks, strict=True)])}
    if len(ents) > 1:
        series[o["compare_label"]] = np.concatenate(
            [e[m] for e, m in zip(ents[1], masks, strict=True)]
        )
    files = [plots.entropy_histogram(series, out / "entropy_hist.png")]
    forking = top_positions(ents[0], rollouts, o["rho"])  # [B, T]
    row = _typical_row(rollouts, forking, o["rho"])
    n = min(len(rollouts[row].completion_ids), 80)
    ids = rollouts[row].completion_ids[:n]
    files.append(
        plots.sequence_entropy(
            [tokenizer.decode([t]) for t in ids],
            list(ents[0][row][:n]),
            forking[row, :n].tolist(),
            out / "entropy_sequence.png",
            threshold=report["threshold"],
            title=f"{o['label']}: entropy along one sequence (red: top-{o['rho']:.0%})",
        )
    )
    if "compare" in report:
        files.append(
            plots.entropy_change(
                report["compare"]["change_by_bucket"],
                out / "entropy_change.png",
                labels=(o["label"], o["compare_label"]),
            )
        )
    return files


def entropy(
    model: Annotated[str, typer.Option(help="Model (base)")] = "smollm2-135m-instruct",
    env: Annotated[str, typer.Option(help="Environment id")] = "arith-v1",
    compare: Annotated[
        str | None, typer.Option(help="Second model (e.g. trained) on the same sequences")
    ] = None,
    ledger: Annotated[
        Path | None, typer.Option(help="Read sequences from this run dir / ledger")
    ] = None,
    step: Annotated[int | None, typer.Option(help="Only ledger rows of this step")] = None,
    prompts: Annotated[int, typer.Option(help="Tasks to sample (or ledger rows / samples)")] = 64,
    samples: Annotated[int, typer.Option(help="Samples per task")] = 1,
    max_new_tokens: Annotated[int, typer.Option()] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling and entropy temperature")] = 1.0,
    rho: Annotated[float, typer.Option(help="Top share counted as forking tokens")] = 0.2,
    split: Annotated[str, typer.Option()] = "test",
    env_kwargs: Annotated[str, typer.Option(help="JSON kwargs for the environment")] = "{}",
    seed: Annotated[int, typer.Option()] = 0,
    micro_batch: Annotated[int, typer.Option(help="Sequences per forward")] = 8,
    out: Annotated[Path, typer.Option(help="Output directory")] = Path("entropy-report"),
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (1 helps on a busy machine)")
    ] = None,
) -> None:
    """Entropy percentiles, forking tokens, and base-vs-trained overlap, with plots."""
    from rich.markdown import Markdown

    from rldojo.commands.evaluation import set_threads
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.training.entropy_analysis import entropy_markdown

    if temperature <= 0 or not 0 < rho <= 1:
        fail("--temperature must be > 0 and --rho in (0, 1]")
    set_threads(threads)
    o = dict(locals())
    o["label"] = Path(model).name or model
    o["compare_label"] = Path(compare).name if compare else ""
    if o["compare_label"] == o["label"]:
        o["compare_label"] += " (compare)"
    errors: tuple[type[Exception], ...] = (*user_errors(), ValueError, FileNotFoundError)
    try:
        report = _analyse(o)
    except errors as exc:
        fail(str(exc))
        return
    text = entropy_markdown(report, labels=(o["label"], o["compare_label"] or "compare"))
    (out / "report.md").write_text(f"# rldojo entropy: {model} on {env}\n\n{text}")
    console.print(Markdown(text))
    console.print(f"wrote {out}/report.json, report.md and plots")


def _analyse(o: dict[str, Any]) -> dict[str, Any]:
    import torch

    from rldojo.policy.models import load_model
    from rldojo.training.entropy_analysis import entropy_report, teacher_forced_entropy

    torch.manual_seed(o["seed"])
    model, tokenizer = load_model(o["model"])
    rollouts = _sequences(o, model, tokenizer)
    if not rollouts:
        raise ValueError("no sequences with policy tokens to analyse")
    kw = {"temperature": o["temperature"], "micro_batch": o["micro_batch"]}
    ents = [teacher_forced_entropy(model, rollouts, **kw)]
    del model
    if o["compare"] is not None:
        other, other_tok = load_model(o["compare"])
        if len(other_tok) != len(tokenizer):
            raise ValueError("the two models use different tokenizers")
        ents.append(teacher_forced_entropy(other, rollouts, **kw))
        del other
    report = entropy_report(
        tokenizer, rollouts, ents[0], rho=o["rho"], compare=ents[1] if len(ents) > 1 else None
    )
    report |= {
        "model": o["model"],
        "compare_model": o["compare"],
        "env": o["env"],
        "temperature": o["temperature"],
        "source": str(o["ledger"]) if o["ledger"] else "generated",
    }
    o["out"].mkdir(parents=True, exist_ok=True)
    report["plots"] = [str(p) for p in _plots(o, tokenizer, rollouts, ents, report)]
    (o["out"] / "report.json").write_text(json.dumps(report, indent=2))
    return report
