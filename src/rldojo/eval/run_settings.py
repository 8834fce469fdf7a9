"""What a run directory's own held-out evaluation is, read from its `config.toml`.

`rldojo eval --model RUN` (`rldojo.commands.eval_inputs`) and `rldojo.evaluate(RUN)`
(`rldojo.api.evaluation`) both start from `run_eval_settings`, so the two evaluate the
same weights on the same tasks in the same way; in each, an argument or flag given wins.

A run directory (`rldojo train`'s, `rldojo sft`'s or `rldojo.train`'s: `RUN/config.toml`,
checkpoints in `RUN/checkpoints/step_NNNNNN`) stands for its newest checkpoint, and its
config gives what its "before" and "after" evaluations used (`rldojo.training.heldout`):
`env.id` and `env.kwargs` (the prompt format lives there), the first `eval.tasks` tasks
of the test split drawn with `run.seed`, greedy turns of `eval.max_new_tokens` (else
`sampling.max_new_tokens`) tokens under the training's episode limits, the grader spec
and the pass threshold.

A run trained on a Python reward function (`rldojo.train(..., reward=fn)`) records an
environment that only the process that trained it registered (its id starts with
`reward.`: `rldojo.envs.function_reward`). Another process cannot rebuild it;
`RunEvalSettings.function_env` says so and `function_env_error` says how to evaluate it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rldojo.config import EvalConfig, TrainConfig, load_config
from rldojo.graders.base import Grader
from rldojo.policy.errors import ModelLoadError

__all__ = ["FUNCTION_ENV_PREFIX", "RunEvalSettings", "is_run_dir", "run_eval_settings"]

FUNCTION_ENV_PREFIX = "reward."
"""How the id of an environment made from a reward function starts (`reward.NAME-v1`)."""


@dataclass(frozen=True)
class RunEvalSettings:
    """A run's held-out evaluation (see the module docstring)."""

    run_dir: Path
    """The run directory."""
    config: TrainConfig
    """Its `config.toml`."""
    env: str | None
    """`env.id`; None when the run trained on several environments (`env.mix`)."""
    env_kwargs: dict[str, Any]
    """`env.kwargs` ({} with `env.mix`)."""
    tasks: int
    """How many tasks of `split`: `eval.tasks`, or its default when the run had none (0)."""
    split: str
    """The split the held-out tasks come from: "test"."""
    seed: int
    """`run.seed`: the tasks drawn and the episodes' seeds."""
    max_new_tokens: int
    """Tokens per policy turn: `eval.max_new_tokens`, else `sampling.max_new_tokens`."""
    episode: dict[str, Any]
    """The training's episode limits: `max_turns`, `max_episode_tokens`, `env_timeout_s`."""
    grade_timeout_s: float
    """`rollout.grade_timeout_s`."""

    @property
    def max_turns(self) -> int:
        """`rollout.max_turns`."""
        return int(self.episode["max_turns"])

    @property
    def function_env(self) -> bool:
        """Whether the env is a reward function's, made in the process that trained."""
        return self.env is not None and self.env.startswith(FUNCTION_ENV_PREFIX)

    def function_env_error(self) -> str:
        """The one line that says how to evaluate a run on a reward function."""
        return (
            f"{self.run_dir}: the run trained on a reward function ({self.env}), which "
            "only the Python process that trained it knows; evaluate it from Python: "
            f"rldojo.evaluate({str(self.run_dir)!r}, tasks=ROWS, reward=FUNCTION)"
        )

    def checkpoint(self) -> Path:
        """The run's newest complete checkpoint; a `ModelLoadError` when it has none yet."""
        from rldojo.store.checkpoint import latest_checkpoint  # imports torch: not before

        found = latest_checkpoint(self.run_dir / "checkpoints")
        if found is None:
            raise ModelLoadError(
                f"model {str(self.run_dir)!r}: a run directory without a "
                "checkpoint yet (RUN/checkpoints/step_NNNNNN)"
            )
        return found

    def grader(self) -> Grader | None:
        """The grader spec's grader (`grader.spec`), None when the env's own grades."""
        if self.config.grader.spec is None:
            return None
        from rldojo.graders import load

        return load(self.config.grader.spec)

    def pass_threshold(self, grader: Grader | None) -> float | None:
        """`grader.pass_threshold`, else that of the spec's `grader`; None: neither says."""
        if self.config.grader.pass_threshold is not None:
            return self.config.grader.pass_threshold
        if grader is not None and self.config.grader.spec is not None:
            return float(getattr(grader, "pass_threshold", 1.0))
        return None


def is_run_dir(spec: object) -> bool:
    """Whether a model spec (a str or path) names a run directory (one with `config.toml`)."""
    if not isinstance(spec, str | Path):
        return False
    return (Path(spec).expanduser() / "config.toml").is_file()


def run_eval_settings(run_dir: str | Path) -> RunEvalSettings:
    """The held-out evaluation of the run in `run_dir` (a `ConfigError` for a bad config)."""
    run = Path(run_dir).expanduser()
    config = load_config(run / "config.toml")
    ro = config.rollout
    return RunEvalSettings(
        run_dir=run,
        config=config,
        env=None if config.env.mix else config.env.id,
        env_kwargs={} if config.env.mix else dict(config.env.kwargs),
        tasks=config.eval.tasks or EvalConfig().tasks,
        split="test",
        seed=config.run.seed,
        max_new_tokens=config.eval.max_new_tokens or config.sampling.max_new_tokens,
        episode={
            "max_turns": ro.max_turns,
            "max_episode_tokens": ro.max_episode_tokens,
            "env_timeout_s": ro.env_timeout_s,
        },
        grade_timeout_s=ro.grade_timeout_s,
    )
