"""`rldojo eval`: held-out accuracy of a model on an environment's test split."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)


def eval_(
    model: Annotated[
        str, typer.Option(help="Model name, directory or checkpoint")
    ] = "smollm2-135m-instruct",
    env: Annotated[str, typer.Option(help="Environment id")] = "arith-v1",
    tasks: Annotated[int, typer.Option(help="Held-out tasks")] = 128,
    max_new_tokens: Annotated[int, typer.Option()] = 48,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path | None, typer.Option(help="Write per-task results as JSON")] = None,
) -> None:
    """Greedy held-out accuracy of a model on an environment's test split."""
    from rldojo.cli import console, fail, user_errors
    from rldojo.envs.registry import make_env
    from rldojo.eval.harness import evaluate
    from rldojo.policy.models import load_model
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.types import SamplingParams

    try:
        environment = make_env(env)
        grader = environment.default_grader()
        test = list(environment.tasks("test", seed=seed, n=tasks))[:tasks]
        m, tok = load_model(model)
        policy = TransformersPolicy(m, tok)
        result = asyncio.run(
            evaluate(
                lambda: make_env(env),
                grader,
                policy,
                test,
                SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
                seed=seed,
            )
        )
    except user_errors() as exc:
        fail(str(exc))
        return
    lo, hi = result.ci95
    console.print(
        f"{model} on {env}: accuracy {result.accuracy:.1%} (n={result.n}, 95% CI "
        f"{lo:.1%}-{hi:.1%}), mean reward {result.mean_reward:.3f}, statuses {result.statuses}"
    )
    if out is not None:
        out.write_text(
            json.dumps(
                {"accuracy": result.accuracy, "ci95": result.ci95, "rows": result.rows}, indent=2
            )
        )
