"""The dry run's plan: the run's size (steps, samples, evaluations, model) and its time
estimate (`rldojo train --dry-run` prints it; `rldojo.training.dry_run.dry_run`).

The estimate is calibrated on this machine with the run's own model and sampler
(`rldojo.training.estimate`: a few seconds of real generation, a few real episodes of a
multi-turn environment and one real micro-batch update), under the machine's load then,
which the plan reports beside the cores. Where that cannot run (a vLLM backend) it falls
back to the cached matmul probe (`rldojo.hardware.precision`), priced as below.

The estimate is an upper bound in the sense that every sample is assumed to use all of
`sampling.max_new_tokens`; real completions are usually shorter. A multi-turn environment
(one with episode `limits`) may take up to `min(rollout.max_turns, limits.max_turns)`
turns: each turn decodes `max_new_tokens`, the environment's reply is counted as long as a
model turn, the engine re-encodes the whole conversation before each turn, and training
sees every turn. A calibrated plan prices a step (and an evaluation) at the mean turn
count of the episodes the calibration played (in the first environment, whose prompts it
times), and shows the range from one turn to every turn beside it; the probe's plan,
which plays none, prices every turn, with the one-turn price as the lower end (an
episode that ends after its first move). The probe fallback's two efficiency factors
(how much of the probe's GFLOP/s decoding and training reach) were measured on
SmolLM2-135M on 2-core EPYC machines of both CPU kinds: about 0.4 for the batched decode
loop and 0.7 for the training forward/backward.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from rldojo.config import TrainConfig
from rldojo.training.estimate import Calibration, StepCost, at_turns, turn_limit
from rldojo.training.heldout import heldout_tasks

__all__ = ["Plan", "load_line", "make_plan"]

DECODE_EFFICIENCY = 0.4
"""Share of the probe's matmul rate the batched decode loop reaches (SmolLM2, 2 cores)."""
TRAIN_EFFICIENCY = 0.7
"""Share of the probe's matmul rate the training forward + backward reaches."""


@dataclass(frozen=True)
class Plan:
    """The run's size and its time estimate (`make_plan`); `lines()` is what the dry run
    prints."""

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
    step_s: float  # a step, every episode at `mean_turns` turns
    eval_s: float  # an evaluation, likewise
    one_turn_step_s: float  # a step if every episode ended after its first turn
    one_turn_eval_s: float
    basis: str = ""  # what the estimate was priced from; "": the matmul probe
    played: int = 0  # episodes the calibration played; 0: none, `mean_turns` is `turns`
    mean_turns: float = 0.0  # their mean model turns
    all_turns_step_s: float = 0.0  # a step if every episode took `turns` turns
    all_turns_eval_s: float = 0.0
    load: float | None = None  # the load average the calibration ran under; None: probe
    cores: int = 0  # the cores this process may use

    @property
    def one_turn_total_s(self) -> float:
        """`total_s` if every episode ended after its first turn (the lower end)."""
        return replace(self, step_s=self.one_turn_step_s, eval_s=self.one_turn_eval_s).total_s

    @property
    def total_s(self) -> float:
        full = self.evaluations - (1 if self.before_tasks else 0)  # of all `eval_tasks`
        before = self.before_tasks / self.eval_tasks if self.eval_tasks else 0.0
        return self.steps * self.step_s + (full + before) * self.eval_s

    @property
    def all_turns_total_s(self) -> float:
        """`total_s` if every episode took `turns` turns (the upper end)."""
        return replace(self, step_s=self.all_turns_step_s, eval_s=self.all_turns_eval_s).total_s

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
            *self._estimate_lines(),
        ]

    def _estimate_lines(self) -> list[str]:
        """The estimate: one price, or (multi-turn) the played turns' price and the range
        from one turn to every turn; then the load it was calibrated under."""
        head = (
            f"estimate ({self.basis or f'matmul probe {self.gflops:.0f} GFLOP/s'}, "
            "every sample at max_new_tokens"
        )
        one = (
            f"~{self.step_s:.0f} s a step, ~{self.eval_s:.0f} s an evaluation, "
            f"~{self.total_s / 60:.1f} min in all"
        )
        span = (
            f"~{self.one_turn_step_s:.0f}-{self.all_turns_step_s:.0f} s a step, "
            f"~{self.one_turn_eval_s:.0f}-{self.all_turns_eval_s:.0f} s an evaluation, "
            f"~{self.one_turn_total_s / 60:.1f}-{self.all_turns_total_s / 60:.1f} min "
            "in all"
        )
        if self.turns == 1:
            out = [f"{head}): {one}"]
        elif not self.played:
            out = [f"{head}; episodes of one to {self.turns} turns): {span}"]
        else:
            mean = f"{self.mean_turns:.2g} turn{'' if self.mean_turns == 1 else 's'}"
            out = [
                f"{head}; episodes of {mean}, the mean of {self.played} played here): {one}",
                f"  if episodes took one to {self.turns} turns: {span}",
            ]
        if self.load is not None:
            out.append(load_line(self.load, self.cores))
        return out


def load_line(load: float, cores: int) -> str:
    """How the machine's load at calibration bears on the estimate."""
    at = f"load: calibrated at load {load:.1f} on {cores} core{'s' if cores != 1 else ''}"
    if load > cores:
        return (
            f"{at}, more than the cores: the estimate is for that load (an idle machine "
            "is faster, a busier one slower)"
        )
    return f"{at}: expect slower steps if the load grows"


def _prompt_and_turns(mixture: Any, tokenizer: Any, max_turns: int) -> tuple[int, int]:
    """The first environment's prompt tokens; the most model turns any episode may take
    (an environment without episode `limits` answers once)."""
    prompt, turns = 0, 1
    for i, slot in enumerate(mixture.slots.values()):
        if not slot.train_tasks:
            continue
        task = slot.train_tasks[0]
        env = mixture.make_env_for(task)
        turns = max(turns, turn_limit(env, max_turns))
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
    """The run's size and a time estimate: from `calibration` when given (at the mean
    turns of the episodes it played), else from the matmul probe's `gflops` (every turn;
    see the module docstring)."""
    ro = config.rollout
    params = sum(p.numel() for p in model.parameters())
    prompt, turns = _prompt_and_turns(mixture, tokenizer, ro.max_turns)
    samples = ro.prompts_per_step * ro.group_size
    rounds = 1 + (ro.max_extra_rounds if ro.dynamic_sampling else 0)
    played: tuple[int, ...] = ()
    if calibration is not None:
        cost = StepCost(calibration, config, prompt)
        step_s, generate_s = cost.step_s, cost.generate_s
        played = calibration.played_turns
    else:
        step_s, generate_s = _probe_prices(config, params, prompt, gflops)
    mean = min(sum(played) / len(played), turns) if played else float(turns)
    eval_new = config.eval.max_new_tokens or config.sampling.max_new_tokens
    eval_tasks, evaluations, before_tasks = _evaluations(config, mixture)

    def eval_s(t: int) -> float:
        return generate_s(eval_tasks, eval_new, t)

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
        step_s=at_turns(step_s, mean),
        eval_s=at_turns(eval_s, mean),
        one_turn_step_s=step_s(1),
        one_turn_eval_s=eval_s(1),
        basis="" if calibration is None else calibration.describe(),
        played=len(played),
        mean_turns=mean,
        all_turns_step_s=step_s(turns),
        all_turns_eval_s=eval_s(turns),
        load=None if calibration is None else calibration.load,
        cores=0 if calibration is None else calibration.cores,
    )


def _evaluations(config: TrainConfig, mixture: Any) -> tuple[int, int, int]:
    """(held-out tasks, evaluations, tasks of the "before" evaluation) of the run."""
    eval_tasks = len(mixture.test_tasks) if config.eval.tasks else 0
    if not eval_tasks:
        return 0, 0, 0
    every = config.eval.every  # none at the last step: "after" is that one
    periodic = max(config.run.steps - 1, 0) // every if every else 0
    evaluations = int(config.eval.before) + periodic + 1
    before_tasks = 0
    if config.eval.before:  # the tasks the trainer's "before" evaluation runs
        before_tasks = len(heldout_tasks(config, mixture.test_tasks, "before"))
    return eval_tasks, evaluations, before_tasks
