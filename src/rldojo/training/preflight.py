"""`rldojo train --dry-run`: validate everything, print the resolved config and the plan.

Nothing is written and no run directory is created. The same checks run at the start of
every real run (`Trainer.__init__`), before its run directory exists: environment ids and
kwargs (against the factory's signature), data files, the grader spec, the model name
(offline unless downloads are allowed). The dry run then loads the model as the run
trains it (to count its parameters and tokenise one prompt), warns when an environment's
prompt asks for reasoning but `sampling.max_new_tokens` is below `REASONING_MIN_TOKENS`
(`reasoning_warnings`), and prints an estimate of the run's time.

The plan and its time estimate are `rldojo.training.plan`'s.
"""

from __future__ import annotations

import asyncio
import re
from functools import partial
from typing import Any

from rldojo.config import TrainConfig, dump_config
from rldojo.training.plan import Plan, make_plan


def env_entries(config: TrainConfig) -> list[tuple[str, dict[str, Any], float]]:
    """`(env id, kwargs, weight)` of every environment the run draws from."""
    return [(e.id, e.kwargs, e.weight) for e in config.env.mix] or [
        (config.env.id, config.env.kwargs, 1.0)
    ]


def build_mixture(config: TrainConfig) -> Any:
    """The run's environments (each built once: ids, kwargs and data files checked) with
    the grader spec's grader, if one replaces the environments' own."""
    from rldojo.graders import load
    from rldojo.rollout.mixture import EnvMixture

    grader = None if config.grader.spec is None else load(config.grader.spec)
    mixture = EnvMixture(
        env_entries(config),
        seed=config.run.seed,
        train_n=config.env.train_tasks,
        test_n=config.eval.tasks,
        grader=grader,
    )
    if grader is not None:
        check_task_templates(grader.spec, mixture)
    check_episodes_at_once(config, mixture)
    return mixture


def check_episodes_at_once(config: TrainConfig, mixture: Any) -> None:
    """`EnvKwargsError` if a batch opens more episodes of an environment at once than it
    holds (`max_episodes_at_once`, e.g. web-crm-v1's browser contexts): the rollout
    engine starts every episode of a batch before its first turn, so the rest would wait
    for a slot until they time out."""
    import math

    from rldojo.envs.kwargs import EnvKwargsError

    ro = config.rollout
    train = math.ceil(ro.prompts_per_step * ro.oversample) * ro.group_size
    for slot in mixture.slots.values():
        if slot.max_at_once is None:
            continue
        limit, key = slot.max_at_once
        for what, n in (("eval.tasks", len(slot.test_tasks)),
                        ("rollout.prompts_per_step x group_size", train)):  # fmt: skip
            if n > limit:
                raise EnvKwargsError(
                    f"env.kwargs.{key}: {slot.env_id} holds {limit} episodes at once, but "
                    f"{what} starts {n} together (before the first turn); lower that or "
                    f"raise env.kwargs.{key}"
                )


TEMPLATE_CHECK_TASKS = 32
"""Training tasks per environment the grader spec's `item` templates are checked against."""


def build_curriculum(config: TrainConfig, mixture: Any, threshold: float) -> Any:
    """The online curriculum over the mixture's train tasks (`[curriculum]`; None when
    off); a task passes at `curriculum.pass_threshold`, else the run's `threshold`."""
    c = config.curriculum
    if not c.enabled:
        return None
    from rldojo.data.curriculum import Curriculum, CurriculumConfig

    tasks = [t for slot in mixture.slots.values() for t in slot.train_tasks]
    knobs = CurriculumConfig(
        window=c.window, mode=c.mode, saturated_weight=c.saturated_weight,
        pass_threshold=threshold if c.pass_threshold is None else c.pass_threshold,
    )  # fmt: skip
    return Curriculum(tasks, knobs)


def check_task_templates(spec: Any, mixture: Any) -> None:
    """`TemplateError` if an `{{item.x}}` of the spec resolves in none of the first tasks
    of an environment, or a `{{sample.x}}` names a key no sample has. Model output is not
    known before sampling, so `sample` paths are checked by their first key only."""
    from rldojo.graders.openai_templates import item_view
    from rldojo.graders.template_check import check_spec_templates

    for env_id, slot in mixture.slots.items():
        tasks = slot.train_tasks[:TEMPLATE_CHECK_TASKS]
        views: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, item_view(t)) for t in tasks]
        check_spec_templates(
            spec,
            views,
            f"the first {len(tasks)} tasks of env {env_id}",
            sample_keys=("output_text", "output_json"),
        )


def pass_threshold(config: TrainConfig, mixture: Any) -> float:
    """The run's pass threshold: `grader.pass_threshold`, else the spec's, else 1.0."""
    if config.grader.pass_threshold is not None:
        return config.grader.pass_threshold
    if config.grader.spec is not None:  # every slot holds the one spec grader
        slot = next(iter(mixture.slots.values()))
        return float(getattr(slot.grader, "pass_threshold", 1.0))
    return 1.0


def check_inputs(config: TrainConfig) -> Any:
    """Validate the environments, data files, grader spec and model name; returns the
    environment mixture. Raises the one-line user errors the CLI reports."""
    from rldojo.policy.models import check_model
    from rldojo.report.trackers import check_report_to

    check_report_to(config.run.report_to)
    mixture = build_mixture(config)
    check_model(config.model.name)
    return mixture


REASONING_MIN_TOKENS = 128
"""A prompt that asks for reasoning with `sampling.max_new_tokens` below this gets a
warning: a small model's chain of thought rarely reaches its answer in fewer tokens."""
_REASONING = re.compile(
    r"step[- ]by[- ]step|\bthink\b|\breason(?:ing)?\b|<think>|chain[- ]of[- ]thought"
    r"|show your work|\bexplain\b",
    re.IGNORECASE,
)


def reasoning_warnings(config: TrainConfig, mixture: Any) -> list[str]:
    """One line per environment whose first training prompt (every message of its opening
    conversation) asks for reasoning ("step by step", "think", "reason", "<think>", "show
    your work", "explain", ...) while `sampling.max_new_tokens < REASONING_MIN_TOKENS`."""
    new = config.sampling.max_new_tokens
    if new >= REASONING_MIN_TOKENS:
        return []
    out = []
    for env_id, slot in mixture.slots.items():
        if not slot.train_tasks:
            continue
        task = slot.train_tasks[0]
        observation = asyncio.run(mixture.make_env_for(task).reset(task, seed=0))
        found = _REASONING.search("\n".join(str(m.get("content") or "")
                                             for m in observation.messages))  # fmt: skip
        if found:
            out.append(
                f"warning: env {env_id}: the prompt asks for reasoning ({found.group(0)!r}) but "
                f"sampling.max_new_tokens = {new} (< {REASONING_MIN_TOKENS}): most completions "
                "will be cut before their answer; raise it"
            )
    return out


def dry_run(config: TrainConfig, console: Any) -> Plan:
    """Validate, resolve and describe the run without writing anything: the resolved
    config, the values its recipe set, a note when the PPO clips cannot act, the plan with
    its calibrated time estimate, and any warnings."""
    import torch

    from rldojo.config.recipes import clip_note, describe_recipe
    from rldojo.hardware.precision import cached_probe
    from rldojo.policy.models import load_model
    from rldojo.policy.training_model import load_training_model
    from rldojo.report.progress import log_lines
    from rldojo.training.estimate import calibrate
    from rldojo.training.resources import resolve_resources

    resolved, precision, threads = resolve_resources(config)
    mixture = check_inputs(resolved)
    device = torch.device(precision.device)
    say = partial(console.print, soft_wrap=True, markup=False, highlight=False)
    with log_lines(say, "rldojo.policy.models"):  # the one-time conversion of SmolLM2
        model, tokenizer = load_training_model(resolved.model, None, device, load_model)
    probe = precision.probe or cached_probe()
    gflops = probe.bf16 if precision.generation_dtype == "bfloat16" else probe.fp32
    dtype = precision.torch_generation_dtype()
    calibration = calibrate(resolved, mixture, model, tokenizer, dtype)
    plan = make_plan(resolved, mixture, model, tokenizer, gflops, calibration)
    console.print(dump_config(resolved), markup=False, highlight=False)
    console.print(f"precision: {precision.generation_dtype} ({precision.reason})", soft_wrap=True)
    console.print(f"threads: {threads.describe()}", soft_wrap=True)
    clip = clip_note(resolved)
    lines = [*describe_recipe(resolved), *([clip] if clip else []), *plan.lines(),
             *reasoning_warnings(resolved, mixture)]  # fmt: skip
    for line in lines:
        console.print(line, soft_wrap=True, markup=False)
    console.print("dry run: nothing was written", soft_wrap=True)
    return plan
