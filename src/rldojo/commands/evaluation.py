"""`rldojo eval`: a model (local or an OpenAI-compatible endpoint) on an environment's tasks.

    rldojo eval --model M --env arith-v1 [--samples K] [--compare M2] [--perturb all]
                [--label-errors FILE] [--out result.json] [--report report.md]
    rldojo eval --model RUN_DIR [--tasks N]     # the run's own held-out evaluation

Reports pass@k (unbiased) for k up to K, avg@K, maj@K and mean reward with task-level
bootstrap intervals; with `--compare`, the paired difference (paired bootstrap, exact
McNemar) on the same tasks and seeds; with `--perturb`, the robustness probes
(`rldojo.eval.perturb`); with `--label-errors`, the noise ceiling (`rldojo.eval.noise`);
and always the failure modes (`rldojo.eval.failures`). A model is a built-in name, a
directory or checkpoint (a LoRA adapter is merged into its base), a run directory (its
newest checkpoint, evaluated as the run's "after" evaluation was, as `rldojo.evaluate`
does it: its env and kwargs, tasks, seed, limits, grader spec and pass threshold unless
given; `rldojo.commands.eval_inputs`), or an endpoint ``http://host:port/v1#name``.
"""

from __future__ import annotations

import asyncio
import json
import math
from functools import partial
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
    from rich.console import Console

    from rldojo.commands.eval_inputs import EvalInputs
    from rldojo.eval.harness import SampledEval
    from rldojo.policy.base import Policy


def set_threads(threads: int | None) -> None:
    """Set torch's CPU threads (None: leave torch's default). On a machine shared with
    other jobs, fewer threads than cores avoids OpenMP oversubscription."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_)


def _policy(spec: str, api_key: str | None, console: Console) -> Policy:
    """A local model (`TransformersPolicy`) or an endpoint (`OpenAIPolicy`) from a spec;
    what loading it logs (the one-time GGUF conversion) is printed on `console`."""
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
    from rldojo.report.progress import log_lines

    path = Path(spec).expanduser()
    say = partial(console.print, soft_wrap=True, markup=False, highlight=False)
    with log_lines(say, "rldojo.policy.models"):
        model, tokenizer = load_merged(path) if is_adapter_dir(path) else load_model(spec)
    cache_mb = GenerationConfig().prefix_cache_mb  # multi-turn episodes: reuse the last turn
    return TransformersPolicy(model, tokenizer, prefix_cache_mb=cache_mb)


class _Runner:
    """Runs evaluations of one environment on one event loop (grader pools bind to it)."""

    def __init__(self, inputs: EvalInputs, sampling: SamplingParams, console: Console) -> None:
        from rldojo.envs.registry import make_env

        self.make_env = lambda: make_env(inputs.env, **inputs.env_kwargs)
        self.grader = inputs.grader or self.make_env().default_grader()
        self.sampling = sampling
        self.episode = {"max_turns": inputs.max_turns, **inputs.episode}
        self.grade_timeout_s, self.pass_threshold = inputs.grade_timeout_s, inputs.pass_threshold
        self.loop = asyncio.new_event_loop()
        self.console = console

    def run(
        self, policy: Policy, tasks: list[Task], samples: int, seed: int, label: str
    ) -> SampledEval:
        """`evaluate_samples`; the console shows `evaluating LABEL: done/total` samples."""
        from rldojo.eval.harness import evaluate_samples
        from rldojo.report.progress import PhaseProgress, with_turn

        shown = PhaseProgress(self.console)
        try:
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
                    grade_timeout_s=self.grade_timeout_s,
                    pass_threshold=self.pass_threshold,
                    progress=lambda turn, done, total: shown.update(
                        f"evaluating {with_turn(label, turn)}", done, total
                    ),
                )
            )
        finally:
            shown.close()


def _ks(samples: int, ks: list[int] | None) -> list[int]:
    if ks:
        return sorted({k for k in ks if 1 <= k <= samples})
    powers = [2**i for i in range(int(math.log2(samples)) + 1)]
    return sorted({*powers, samples})


def _robustness(
    runner: _Runner, policy: Policy, tasks: list[Task], base: SampledEval, args: dict[str, Any]
) -> dict[str, Any]:
    from rldojo.envs.mcq.items import item_from_task
    from rldojo.eval.perturb import robustness_report, select_suite

    suite = select_suite(args["perturb"], item_from_task(tasks[0]) is not None)
    outcomes = {"baseline": {k: v > 0 for k, v in base.per_task("maj").items()}}
    for p in suite[1:]:
        result = runner.run(
            policy, [p.apply(t) for t in tasks], args["samples"], args["seed"], p.name
        )
        outcomes[p.name] = {k: v > 0 for k, v in result.per_task("maj").items()}
    return robustness_report(outcomes, n_resamples=args["bootstrap"], seed=args["seed"])


_Tasks = Annotated[
    int | None,
    typer.Option(help="Tasks of the split to evaluate (default: the run's eval.tasks, else 128)"),
]
_MaxTurns = Annotated[
    int | None, typer.Option(help="Model turns an episode may take (default: the run's, else 8)")
]
_Seed = Annotated[
    int | None, typer.Option(help="Draws the tasks (default: the run's run.seed, else 0)")
]
_PassThreshold = Annotated[
    float | None,
    typer.Option(
        help="A sample passes at this score (default: the run's grader.pass_threshold or its "
        "grader spec's, else 1.0; a grader's `correct` component decides itself)"
    ),
]
"""The options of `rldojo eval` that a run directory answers too (`eval_inputs.OPTIONS`)."""


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
    tasks: _Tasks = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="Default: the run's eval.max_new_tokens, else 48")
    ] = None,
    max_turns: _MaxTurns = None,
    seed: _Seed = None,
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
    split: Annotated[str | None, typer.Option(help="Default: the run's (test), else test")] = None,
    pass_threshold: _PassThreshold = None,
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


def _resolve(o: dict[str, Any], console: Console) -> EvalInputs:
    """What to evaluate (`eval_inputs.resolve`), also written back into `o` (the model, the
    env, the tasks, the seed, the limits, the pass threshold) for the reports."""
    from rldojo.commands.eval_inputs import OPTIONS, is_run_dir, newest_checkpoint, resolve

    inputs = resolve(o["model"], o)
    o |= {"model": inputs.model} | {k: getattr(inputs, k) for k in OPTIONS}
    if is_run_dir(o["compare"]):
        o["compare"] = str(newest_checkpoint(Path(o["compare"]).expanduser()))
    if inputs.run is not None:
        console.print(
            f"{inputs.run}: {Path(inputs.model).name} on {inputs.env} "
            f"{json.dumps(inputs.env_kwargs)}, max_new_tokens "
            f"{inputs.max_new_tokens}, max_turns {inputs.max_turns}; {inputs.tasks} "
            f"{inputs.split} tasks, seed {inputs.seed}, pass threshold "
            f"{inputs.pass_threshold:g}",
            soft_wrap=True,
            highlight=False,
        )
    return inputs


def _check_adapter_base(spec: str) -> str:
    """What to check of a spec: a LoRA adapter's base model, else the spec itself."""
    from rldojo.policy.lora import adapter_base_name, is_adapter_dir

    path = Path(spec).expanduser()
    return adapter_base_name(path) if is_adapter_dir(path) else spec


def _run(o: dict[str, Any], console: Console) -> dict[str, Any]:
    from rldojo.envs.registry import make_env
    from rldojo.eval.failures import failures_table, group_failures

    inputs = _resolve(o, console)
    kwargs = inputs.env_kwargs
    _check_models(o["model"], o["compare"])  # both, before evaluating either
    task_list = list(make_env(o["env"], **kwargs).tasks(o["split"], seed=o["seed"], n=o["tasks"]))
    if not task_list:
        raise ValueError(f"{o['env']} has no {o['split']} tasks")
    task_list = task_list[: o["tasks"]]
    sampling = SamplingParams(o["max_new_tokens"], o["temperature"])
    runner = _Runner(inputs, sampling, console)
    policy = _policy(o["model"], o["api_key"], console)
    result = runner.run(policy, task_list, o["samples"], o["seed"], o["model"])
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
    result: SampledEval,
    ks: list[int],
    data: dict[str, Any],
    console: Console,
) -> None:
    from rldojo.eval.failures import failures_table, group_failures
    from rldojo.eval.harness import compare_evals

    other = runner.run(
        _policy(o["compare"], o["api_key"], console), tasks, o["samples"], o["seed"], o["compare"]
    )
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
    o: dict[str, Any],
    tasks: list[Task],
    result: SampledEval,
    data: dict[str, Any],
    console: Console,
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
