"""`rldojo train --dry-run`: validate everything, print the resolved config and the plan.

Nothing is written and no run directory is created. The same checks run at the start of
every real run (`Trainer.__init__`), before its run directory exists: environment ids and
kwargs (against the factory's signature), data files, the grader spec, the model name
(offline unless downloads are allowed). The dry run then loads the model as the run
trains it (to count its parameters and tokenise one prompt), warns when an environment's
prompt asks for reasoning but `sampling.max_new_tokens` is below `REASONING_MIN_TOKENS`
(`reasoning_warnings`), and prints an estimate of the run's time.

The estimate is calibrated on this machine with the run's own model and sampler
(`rldojo.training.estimate`: a few seconds of real generation and one real micro-batch
update). Where that cannot run (a vLLM backend) it falls back to the cached matmul probe
(`rldojo.hardware.precision`), priced as below.

The estimate is an upper bound in the sense that every sample is assumed to use all of
`sampling.max_new_tokens`; real completions are usually shorter. A multi-turn environment
(one with episode `limits`) is priced at every one of its turns, `min(rollout.max_turns,
limits.max_turns)`: each turn decodes `max_new_tokens`, the environment's reply is counted
as long as a model turn, the engine re-encodes the whole conversation before each turn,
and training sees every turn; the plan also shows the one-turn price, the lower end (an
episode that ends after its first move). Its two efficiency
factors of the probe fallback (how much of the probe's GFLOP/s decoding and training
reach) were measured on SmolLM2-135M on 2-core EPYC machines of both CPU kinds: about 0.4
for the batched decode loop and 0.7 for the training forward/backward.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace
from typing import Any

from rldojo.config import TrainConfig, dump_config
from rldojo.training.estimate import Calibration, StepCost
from rldojo.training.heldout import heldout_tasks

DECODE_EFFICIENCY = 0.4
"""Share of the probe's matmul rate the batched decode loop reaches (SmolLM2, 2 cores)."""
TRAIN_EFFICIENCY = 0.7
"""Share of the probe's matmul rate the training forward + backward reaches."""


@dataclass(frozen=True)
class Plan:
    steps: int
    samples_per_step: int
    max_samples_per_step: int
    eval_tasks: int
    evaluations: int
    before_tasks: int  # tasks of the "before" evaluation (`eval.before_tasks`); 0: none
    parameters: int
    prompt_tokens: int
    gflops: float
    turns: int  # the most model turns an episode may take (1: single-turn environments)
    step_s: float  # a step, every episode at `turns` turns
    eval_s: float  # an evaluation, likewise
    one_turn_step_s: float  # a step if every episode ended after its first turn
    one_turn_eval_s: float
    basis: str = ""  # what the estimate was priced from; "": the matmul probe

    @property
    def one_turn_total_s(self) -> float:
        """`total_s` if every episode ended after its first turn (the lower end)."""
        return replace(self, step_s=self.one_turn_step_s, eval_s=self.one_turn_eval_s).total_s

    @property
    def total_s(self) -> float:
        full = self.evaluations - (1 if self.before_tasks else 0)  # of all `eval_tasks`
        before = self.before_tasks / self.eval_tasks if self.eval_tasks else 0.0
        return self.steps * self.step_s + (full + before) * self.eval_s

    def lines(self) -> list[str]:
        short = ""
        if 0 < self.before_tasks < self.eval_tasks:
            short = f' ("before" on the first {self.before_tasks})'
        return [
            f"steps: {self.steps}, each {self.samples_per_step} samples "
            f"(up to {self.max_samples_per_step} with dynamic-sampling refills)",
            f"held-out evaluation: {self.eval_tasks} tasks x {self.evaluations} evaluations"
            + short,
            f"model: {self.parameters / 1e6:.1f}M parameters; a prompt is ~{self.prompt_tokens}"
            " tokens",
            f"estimate ({self.basis or f'matmul probe {self.gflops:.0f} GFLOP/s'}, "
            "every sample at max_new_tokens"
            + (
                f"; episodes of one to {self.turns} turns): "
                f"~{self.one_turn_step_s:.0f}-{self.step_s:.0f} s a step, "
                f"~{self.one_turn_eval_s:.0f}-{self.eval_s:.0f} s an evaluation, "
                f"~{self.one_turn_total_s / 60:.1f}-{self.total_s / 60:.1f} min in all"
                if self.turns > 1
                else f"): ~{self.step_s:.0f} s a step, ~{self.eval_s:.0f} s an evaluation, "
                f"~{self.total_s / 60:.1f} min in all"
            ),
        ]


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


def _prompt_and_turns(mixture: Any, tokenizer: Any, max_turns: int) -> tuple[int, int]:
    """The first environment's prompt tokens; the most model turns any episode may take
    (an environment without episode `limits` answers once)."""
    prompt, turns = 0, 1
    for i, slot in enumerate(mixture.slots.values()):
        if not slot.train_tasks:
            continue
        task = slot.train_tasks[0]
        env = mixture.make_env_for(task)
        limits = getattr(env, "limits", None)
        if limits is not None:
            turns = max(turns, min(max_turns, limits.max_turns))
        if i == 0:
            observation = asyncio.run(env.reset(task, seed=0))
            text = tokenizer.apply_chat_template(
                observation.messages, tokenize=False, add_generation_prompt=True
            )
            prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompt, turns


def _episode_cost(params: int, n: int, new: int, prompt: int, turns: int, rate: float) -> float:
    """Seconds to generate `n` episodes of `turns` turns: the one-turn price (decoding
    `new` tokens and the prompt, at the decode efficiency) plus, from the second turn, the
    re-encoded conversation (prompt and 2 x `new` tokens a finished turn) and `new` more."""
    first = 2 * params * n * (new + prompt) / (rate * DECODE_EFFICIENCY)
    later = sum(
        2 * params * n * new / (rate * DECODE_EFFICIENCY)
        + 2 * params * n * (prompt + 2 * t * new) / (rate * TRAIN_EFFICIENCY)
        for t in range(1, turns)
    )
    return first + later


def _probe_prices(config: TrainConfig, params: int, prompt: int, gflops: float) -> tuple[Any, Any]:
    """`(step_s(turns), eval_s(tasks, new, turns))` priced from the matmul probe."""
    ro, n_new = config.rollout, config.sampling.max_new_tokens
    samples = ro.prompts_per_step * ro.group_size
    rate = max(gflops, 1e-3) * 1e9

    def step_s(t: int) -> float:
        # the prompt's decode-time cost is left out of a step's generation (calibrated so)
        generate = _episode_cost(params, samples, n_new, prompt, t, rate)
        generate -= 2 * params * samples * prompt / (rate * DECODE_EFFICIENCY)
        trained = (2 * t - 1) * n_new + prompt / ro.group_size  # completion + shared prompt
        return generate + 6 * params * samples * trained / (rate * TRAIN_EFFICIENCY)

    def eval_s(tasks: int, new: int, t: int) -> float:
        return _episode_cost(params, tasks, new, prompt, t, rate)

    return step_s, eval_s


def make_plan(
    config: TrainConfig,
    mixture: Any,
    model: Any,
    tokenizer: Any,
    gflops: float,
    calibration: Calibration | None = None,
) -> Plan:
    """The run's size and a time estimate: from `calibration` when given, else from the
    matmul probe's `gflops` (see the module docstring)."""
    ro = config.rollout
    params = sum(p.numel() for p in model.parameters())
    prompt, turns = _prompt_and_turns(mixture, tokenizer, ro.max_turns)
    samples = ro.prompts_per_step * ro.group_size
    rounds = 1 + (ro.max_extra_rounds if ro.dynamic_sampling else 0)
    if calibration is not None:
        cost = StepCost(calibration, config, prompt)
        step_s, eval_s = cost.step_s, cost.generate_s
    else:
        step_s, eval_s = _probe_prices(config, params, prompt, gflops)
    eval_new = config.eval.max_new_tokens or config.sampling.max_new_tokens
    eval_tasks = len(mixture.test_tasks) if config.eval.tasks else 0
    evaluations = before_tasks = 0
    if eval_tasks:
        every = config.eval.every  # none at the last step: "after" is that one
        periodic = max(config.run.steps - 1, 0) // every if every else 0
        evaluations = int(config.eval.before) + periodic + 1
        if config.eval.before:  # the tasks the trainer's "before" evaluation runs
            before_tasks = len(heldout_tasks(config, mixture.test_tasks, "before"))
    return Plan(
        steps=config.run.steps,
        samples_per_step=samples,
        max_samples_per_step=samples * rounds,
        eval_tasks=eval_tasks,
        evaluations=evaluations,
        before_tasks=before_tasks,
        parameters=params,
        prompt_tokens=prompt,
        gflops=gflops,
        turns=turns,
        step_s=step_s(turns),
        eval_s=eval_s(eval_tasks, eval_new, turns),
        one_turn_step_s=step_s(1),
        one_turn_eval_s=eval_s(eval_tasks, eval_new, 1),
        basis="" if calibration is None else calibration.describe(),
    )


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
    from rldojo.training.estimate import calibrate
    from rldojo.training.resources import resolve_resources

    resolved, precision, threads = resolve_resources(config)
    mixture = check_inputs(resolved)
    device = torch.device(precision.device)
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
