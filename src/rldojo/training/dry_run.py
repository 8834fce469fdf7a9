"""`rldojo train --dry-run`: validate everything, print the resolved config and the plan.

Nothing is written and no run directory is created. The same checks run at the start of
every real run (`rldojo.training.run.Run`), before its run directory exists: environment
ids and kwargs (against the factory's signature), data files, the grader spec, the model
name (offline unless downloads are allowed); they are `rldojo.training.inputs`'. The dry
run then loads the model as the run trains it (to count its parameters and tokenise one
prompt), warns when an environment's prompt asks for reasoning but
`sampling.max_new_tokens` is below `REASONING_MIN_TOKENS` (`reasoning_warnings`), and
prints an estimate of the run's time.

The plan and its time estimate are `rldojo.training.plan`'s.
"""

from __future__ import annotations

import asyncio
import re
from functools import partial
from typing import Any

from rldojo.config import TrainConfig, dump_config
from rldojo.training.inputs import check_inputs
from rldojo.training.plan import Plan, make_plan

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
        found = _REASONING.search(
            "\n".join(str(m.get("content") or "") for m in observation.messages)
        )
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
    lines = [
        *describe_recipe(resolved),
        *([clip] if clip else []),
        *plan.lines(),
        *reasoning_warnings(resolved, mixture),
    ]
    for line in lines:
        console.print(line, soft_wrap=True, markup=False)
    console.print("dry run: nothing was written", soft_wrap=True)
    return plan
