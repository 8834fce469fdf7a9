"""`rldojo eval`: a model (local or an OpenAI-compatible endpoint) on an environment's tasks.

    rldojo eval --model M --env arith-v1 [--samples K] [--compare M2] [--perturb all]
                [--label-errors FILE] [--out result.json] [--report report.md]
    rldojo eval --model RUN_DIR [--tasks N]     # its newest checkpoint, env and prompts

Reports pass@k (unbiased) for k up to K, avg@K, maj@K and mean reward with task-level
bootstrap intervals; with `--compare`, the paired difference (paired bootstrap, exact
McNemar) on the same tasks and seeds; with `--perturb`, the robustness probes
(`rldojo.eval.perturb`); with `--label-errors`, the noise ceiling (`rldojo.eval.noise`);
and always the failure modes (`rldojo.eval.failures`). A model is a built-in name, a
directory or checkpoint (a LoRA adapter is merged into its base), a run directory (its
newest checkpoint; its env, kwargs and limits unless given: `rldojo.commands.eval_inputs`),
or an endpoint ``http://host:port/v1#served-model-name``.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rldojo.commands.eval_report import (
    markdown_report,
    metrics_json,
    print_robustness,
    summary_table,
    task_rows,
)
from rldojo.types import SamplingParams, Task

if TYPE_CHECKING:
    from rldojo.policy.base import Policy


def set_threads(threads: int | None) -> None:
    """Set torch's CPU threads (None: leave torch's default). On a machine shared with
    other jobs, fewer threads than cores avoids OpenMP oversubscription."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)


def _policy(spec: str, api_key: str | None) -> Policy:
    """A local model (`TransformersPolicy`) or an endpoint (`OpenAIPolicy`) from a spec."""
    if spec.startswith(("http://", "https://")):
        import os

        from rldojo.policy.adapters import OpenAIPolicy

        base_url, _, served = spec.partition("#")
        key = api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
        return OpenAIPolicy(base_url, served or "default", api_key=key)
    from rldojo.config import GenerationConfig
    from rldojo.policy.lora import is_adapter_dir, load_merged
    from rldojo.policy.models import load_model
    from rldojo.policy.transformers_backend import TransformersPolicy

    path = Path(spec).expanduser()
    model, tokenizer = load_merged(path) if is_adapter_dir(path) else load_model(spec)
    cache_mb = GenerationConfig().prefix_cache_mb  # multi-turn episodes: reuse the last turn
    return TransformersPolicy(model, tokenizer, prefix_cache_mb=cache_mb)


class _Runner:
    """Runs evaluations of one environment on one event loop (grader pools bind to it)."""

    def __init__(
        self, env_id: str, env_kwargs: dict[str, Any], sampling: SamplingParams, max_turns: int
    ) -> None:
        from rldojo.envs.registry import make_env

        self.make_env = lambda: make_env(env_id, **env_kwargs)
        self.grader = self.make_env().default_grader()
        self.sampling, self.episode = sampling, {"max_turns": max_turns}
        self.loop = asyncio.new_event_loop()

    def run(self, policy: Policy, tasks: list[Task], samples: int, seed: int) -> Any:
        from rldojo.eval.harness import evaluate_samples

        return self.loop.run_until_complete(
            evaluate_samples(
                self.make_env,
                self.grader,
                policy,
                tasks,
                self.sampling,
                samples=samples,
                seed=seed,
                episode=self.episode,
            )
        )


def _ks(samples: int, ks: list[int] | None) -> list[int]:
    if ks:
        return sorted({k for k in ks if 1 <= k <= samples})
    powers = [2**i for i in range(int(math.log2(samples)) + 1)]
    return sorted({*powers, samples})


def _robustness(runner: _Runner, policy: Policy, tasks: list[Task], base: Any, args: Any) -> Any:
    from rldojo.envs.mcq.items import item_from_task
    from rldojo.eval.perturb import robustness_report, select_suite

    suite = select_suite(args["perturb"], item_from_task(tasks[0]) is not None)
    outcomes = {"baseline": {k: v > 0 for k, v in base.per_task("maj").items()}}
    for p in suite[1:]:
        result = runner.run(policy, [p.apply(t) for t in tasks], args["samples"], args["seed"])
        outcomes[p.name] = {k: v > 0 for k, v in result.per_task("maj").items()}
    return robustness_report(outcomes, n_resamples=args["bootstrap"], seed=args["seed"])


def eval_(
    model: Annotated[
        str,
        typer.Option(
            help="Model name, directory, checkpoint, run directory (its newest checkpoint, "
            "env and prompts), or http://host/v1#name"
        ),
    ] = "smollm2-135m-instruct",
    env: Annotated[
        str | None, typer.Option(help="Environment id (default: the run's, else arith-v1)")
    ] = None,
    tasks: Annotated[int, typer.Option(help="Tasks of the split to evaluate")] = 128,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="Default: the run's eval.max_new_tokens, else 48")
    ] = None,
    max_turns: Annotated[
        int | None,
        typer.Option(help="Model turns an episode may take (default: the run's, else 8)"),
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write results as JSON (per task; per sample, turns included: `records`)"
        ),
    ] = None,
    samples: Annotated[int, typer.Option(help="Samples per task (K)")] = 1,
    temperature: Annotated[
        float | None, typer.Option(help="Default: greedy for K=1, else 0.7")
    ] = None,
    k: Annotated[list[int] | None, typer.Option("--k", help="pass@k values to report")] = None,
    compare: Annotated[
        str | None,
        typer.Option(help="A second model (or run directory), paired on the same tasks"),
    ] = None,
    split: Annotated[str, typer.Option()] = "test",
    env_kwargs: Annotated[
        str | None, typer.Option(help="JSON kwargs for the environment (default: the run's)")
    ] = None,
    perturb: Annotated[
        list[str] | None, typer.Option(help="Robustness probes: 'all' or variant names")
    ] = None,
    label_errors: Annotated[
        Path | None, typer.Option(help="Label-error file (noise ceiling)")
    ] = None,
    chance: Annotated[float, typer.Option(help="Chance a wrong answer hits a wrong label")] = 0.0,
    report: Annotated[Path | None, typer.Option(help="Write a Markdown report")] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples")] = 2000,
    api_key: Annotated[
        str | None, typer.Option(help="Endpoint key (default $OPENAI_API_KEY)")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (1 helps on a busy machine)")
    ] = None,
) -> None:
    """pass@k, avg@k, maj@k with intervals; paired comparison; robustness; failure modes."""
    from rldojo.commands.ui import console, fail

    if samples < 1:
        fail("--samples must be >= 1")
    if max_turns is not None and max_turns < 1:
        fail("--max-turns must be >= 1")
    set_threads(threads)
    opts = dict(locals())
    opts["temperature"] = temperature if temperature is not None else (0.0 if samples == 1 else 0.7)
    try:
        data = _run(opts, console)
    except _errors() as exc:
        fail(str(exc))
        return
    if out is not None:
        out.write_text(json.dumps(data, indent=2, default=str))
    if report is not None:
        report.write_text(markdown_report(data))
        if "robustness" in data:
            from rldojo.eval.plots import robustness

            robustness(
                data["robustness"]["variants"], report.with_name(f"{report.stem}_robustness.png")
            )


def _errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's input (or endpoint), shown as one line."""
    from openai import OpenAIError

    from rldojo.commands.ui import user_errors

    return (*user_errors(), json.JSONDecodeError, ValueError, FileNotFoundError, OpenAIError)


def _check_models(*specs: str | None) -> None:
    """A local model that cannot load is an error before any evaluation runs."""
    from rldojo.policy.models import check_model

    for spec in specs:
        if spec is not None and not spec.startswith(("http://", "https://")):
            check_model(_check_adapter_base(spec))


def _resolve(o: dict[str, Any], console: Any) -> dict[str, Any]:
    """Fill `o`'s model, env and limits (`eval_inputs.resolve`); the env kwargs."""
    from rldojo.commands.eval_inputs import is_run_dir, newest_checkpoint, resolve

    inputs = resolve(o["model"], o["env"], o["env_kwargs"], o["max_new_tokens"], o["max_turns"])
    o |= {"model": inputs.model, "env": inputs.env, "max_new_tokens": inputs.max_new_tokens,
          "max_turns": inputs.max_turns}  # fmt: skip
    if is_run_dir(o["compare"]):
        o["compare"] = str(newest_checkpoint(Path(o["compare"]).expanduser()))
    if inputs.run is not None:
        console.print(f"{inputs.run}: {Path(inputs.model).name} on {inputs.env} "
                      f"{json.dumps(inputs.env_kwargs)}, max_new_tokens "
                      f"{inputs.max_new_tokens}, max_turns {inputs.max_turns}",
                      soft_wrap=True, highlight=False)  # fmt: skip
    return inputs.env_kwargs


def _check_adapter_base(spec: str) -> str:
    """What to check of a spec: a LoRA adapter's base model, else the spec itself."""
    from rldojo.policy.lora import adapter_base_name, is_adapter_dir

    path = Path(spec).expanduser()
    return adapter_base_name(path) if is_adapter_dir(path) else spec


def _run(o: dict[str, Any], console: Any) -> dict[str, Any]:
    from rldojo.envs.registry import make_env
    from rldojo.eval.failures import failures_table, group_failures

    kwargs = _resolve(o, console)
    _check_models(o["model"], o["compare"])  # both, before evaluating either
    task_list = list(make_env(o["env"], **kwargs).tasks(o["split"], seed=o["seed"], n=o["tasks"]))
    if not task_list:
        raise ValueError(f"{o['env']} has no {o['split']} tasks")
    task_list = task_list[: o["tasks"]]
    sampling = SamplingParams(o["max_new_tokens"], o["temperature"])
    runner = _Runner(o["env"], kwargs, sampling, o["max_turns"])
    policy = _policy(o["model"], o["api_key"])
    result = runner.run(policy, task_list, o["samples"], o["seed"])
    ks = _ks(o["samples"], o["k"])
    summary = result.summary(ks, n_resamples=o["bootstrap"], seed=o["seed"])
    title = (
        f"{o['model']} on {o['env']} ({len(task_list)} tasks, "
        f"K={o['samples']}, T={o['temperature']:g})"
    )
    console.print(summary_table(title, summary))
    first = summary[f"pass@{ks[0]}"]
    data: dict[str, Any] = {
        "model": o["model"],
        "env": o["env"],
        "env_kwargs": kwargs,
        "samples": o["samples"],
        "temperature": o["temperature"],
        "accuracy": first.value,
        "ci95": [first.lo, first.hi],
        "statuses": result.statuses(),
        "metrics": metrics_json(summary),
        "rows": task_rows(result, ks),
    }
    if o["compare"] is not None:
        _compare(o, runner, task_list, result, ks, data, console)
    if o["perturb"]:
        data["robustness"] = _robustness(runner, policy, task_list, result, o)
        print_robustness(console, data["robustness"])
    if o["label_errors"] is not None:
        _noise(o, task_list, result, data, console)
    groups = group_failures(result.records)
    if groups:
        console.print(failures_table(groups, title=f"failure modes of {o['model']}"))
    data["failures"] = [g.__dict__ for g in groups]
    data["records"] = result.records
    console.print(f"statuses {data['statuses']}")
    return data


def _compare(
    o: dict[str, Any],
    runner: _Runner,
    tasks: list[Task],
    result: Any,
    ks: list[int],
    data: dict[str, Any],
    console: Any,
) -> None:
    from rldojo.eval.failures import failures_table, group_failures
    from rldojo.eval.harness import compare_evals

    other = runner.run(_policy(o["compare"], o["api_key"]), tasks, o["samples"], o["seed"])
    other_summary = other.summary(ks, n_resamples=o["bootstrap"], seed=o["seed"])
    console.print(summary_table(f"{o['compare']} on {o['env']}", other_summary))
    c = compare_evals(result, other, n_resamples=o["bootstrap"], seed=o["seed"])
    other_groups = group_failures(other.records)
    data["compare_failures"] = [g.__dict__ for g in other_groups]
    if other_groups:
        console.print(failures_table(other_groups, title=f"failure modes of {o['compare']}"))
    data |= {
        "compare_model": o["compare"],
        "compare": c,
        "compare_metrics": metrics_json(other_summary),
    }
    console.print(
        f"B - A avg@{o['samples']}: {c['diff']:+.3f} (95% CI {c['diff_ci95'][0]:+.3f} to "
        f"{c['diff_ci95'][1]:+.3f}, p={c['bootstrap_p']:.3g}); McNemar "
        f"{c['mcnemar']['a_only']}/{c['mcnemar']['b_only']} discordant (A only/B only), "
        f"p={c['mcnemar']['p_value']:.3g}"
    )


def _noise(
    o: dict[str, Any], tasks: list[Task], result: Any, data: dict[str, Any], console: Any
) -> None:
    from rldojo.eval.noise import load_label_errors, noise_ceiling

    p_err = load_label_errors(o["label_errors"], {t.id: t.answer for t in tasks})
    outcomes = {t: v > 0 for t, v in result.per_task("maj").items()}
    noise = noise_ceiling(outcomes, p_err, chance=o["chance"], seed=o["seed"]).as_dict()
    data["noise"] = noise
    console.print(
        f"noise ceiling {noise['ceiling']:.3f}; observed {noise['observed']:.3f}, "
        f"adjusted {noise['adjusted']:.3f}, relative to ceiling {noise['relative']:.3f}"
    )
