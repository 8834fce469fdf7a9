"""Held-out evaluation of a run: the greedy evaluation, what is kept of it (the run
state's record, `RUN/evals/LABEL.jsonl` per task). Shared by the objectives of the run
loop (`rldojo.training.loop`); what is reported of it goes to the callbacks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig
from rldojo.envs.base import EnvFactory
from rldojo.eval.harness import EvalResult, evaluate
from rldojo.graders.base import Grader
from rldojo.policy.base import Policy
from rldojo.rollout.episodes import TurnProgress
from rldojo.store.files import write_atomically
from rldojo.types import SamplingParams, Task


def heldout_eval(
    config: TrainConfig,
    make_env: EnvFactory,
    grader: Grader,
    policy: Policy,
    tasks: Sequence[Task],
    threshold: float,
    loop: asyncio.AbstractEventLoop,
    progress: TurnProgress | None = None,
) -> EvalResult:
    """Greedy accuracy on held-out tasks (`[eval]`), run on `loop` (grader pools bind to
    it), episodes under the training's limits (`rollout.max_turns`, ...): what
    `Trainer.evaluate` and `rldojo sft` report. `progress` hears how far each turn got."""
    max_new = config.eval.max_new_tokens or config.sampling.max_new_tokens
    greedy = SamplingParams(max_new_tokens=max_new, temperature=0.0, seed=0)
    ro = config.rollout  # the training episodes' limits
    limits = {
        "max_turns": ro.max_turns,
        "max_episode_tokens": ro.max_episode_tokens,
        "env_timeout_s": ro.env_timeout_s,
        "engine": ro.engine,
    }
    return loop.run_until_complete(
        evaluate(
            make_env,
            grader,
            policy,
            tasks,
            greedy,
            seed=config.run.seed,
            grade_timeout_s=ro.grade_timeout_s,
            pass_threshold=threshold,
            episode=limits,
            progress=progress,
        )
    )


def heldout_tasks(config: TrainConfig, tasks: Sequence[Task], label: str) -> Sequence[Task]:
    """The tasks of the evaluation `label`: all of them, except "before" when
    `eval.before_tasks` keeps only its first K."""
    k = config.eval.before_tasks
    return tasks[:k] if label == "before" and k is not None else tasks


def eval_record(result: EvalResult) -> dict[str, Any]:
    """What the run state and the summary keep of an evaluation."""
    return {
        "accuracy": result.accuracy,
        "ci95": result.ci95,
        "n": result.n,
        "mean_reward": result.mean_reward,
        "statuses": result.statuses,
    }


def save_eval_rows(run_dir: Path, label: str, result: EvalResult) -> None:
    """RUN/evals/LABEL.jsonl: one line per held-out task (see the module docstring)."""
    keys = ("task_id", "passed", "value", "status")
    lines = "".join(json.dumps({k: row.get(k) for k in keys}) + "\n" for row in result.rows)
    (run_dir / "evals").mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / "evals" / f"{label}.jsonl", lines)
