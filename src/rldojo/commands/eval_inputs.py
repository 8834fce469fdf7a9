"""What `rldojo eval` evaluates: the model, the environment and its kwargs, the tasks, and
how episodes are played and graded; each from the command line, else from the run
directory given as the model, else the built-in default.

A run directory stands for its newest checkpoint, and its `config.toml` gives what the
run's own held-out evaluation used (`rldojo.eval.run_settings`, which `rldojo.evaluate`
reads too): `env.id` and `env.kwargs` (the prompt format lives there: the system prompt,
the answer format, the tool schema style, ...), the first `eval.tasks` tasks of the test
split drawn with `run.seed`, `eval.max_new_tokens` (or `sampling.max_new_tokens`), the
episode limits (`rollout.max_turns`, ...), the grader spec and the pass threshold. So

    rldojo eval --model runs/agentic-crm             # repeats the run's "after" evaluation
    rldojo eval --model runs/agentic-crm --tasks 48  # on 48 of the same split's tasks

A run trained on a Python reward function cannot be evaluated here (its environment lives
in the process that trained it): that is one line saying to use `rldojo.evaluate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rldojo.commands.ui import parse_env_kwargs
from rldojo.config import ConfigError
from rldojo.eval.run_settings import is_run_dir, run_eval_settings
from rldojo.graders.base import Grader

__all__ = ["OPTIONS", "EvalInputs", "is_run_dir", "newest_checkpoint", "resolve"]

OPTIONS = ("env", "tasks", "split", "seed", "max_new_tokens", "max_turns", "pass_threshold")
"""The command line's options a run directory also answers (`env_kwargs` too, as JSON)."""


@dataclass(frozen=True)
class EvalInputs:
    """The resolved inputs of one evaluation."""

    model: str
    """The model spec; a run directory's newest checkpoint."""
    env: str = "arith-v1"
    """The environment id."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Its kwargs (the run's apply only to the run's env)."""
    tasks: int = 128
    """How many tasks of `split` (the first ones drawn with `seed`)."""
    split: str = "test"
    """The split the tasks come from."""
    seed: int = 0
    """Draws the tasks and seeds the episodes."""
    max_new_tokens: int = 48
    """Tokens per policy turn."""
    max_turns: int = 8
    """Policy turns an episode may take."""
    episode: dict[str, Any] = field(default_factory=dict)
    """The other episode limits (`max_episode_tokens`, `env_timeout_s`); {}: the engine's."""
    grade_timeout_s: float = 30.0
    """Time limit of one grade, in seconds."""
    grader: Grader | None = None
    """The run's grader spec's grader (on the run's env only); None: the env's own."""
    pass_threshold: float = 1.0
    """A sample passes at this value (a grader that reports `correct` decides itself)."""
    run: Path | None = None
    """The run directory the model came from, if any."""


def newest_checkpoint(run: Path) -> Path:
    """The run's newest complete checkpoint; a `ModelLoadError` when it has none yet."""
    return run_eval_settings(run).checkpoint()


def resolve(model: str, given: Mapping[str, Any]) -> EvalInputs:
    """The inputs of one evaluation (see the module docstring). `given` holds the command
    line's values by option name (`OPTIONS`, and `env_kwargs` as JSON); None: not given.
    A run on a reward function, evaluated on its own env, is a `ValueError` (one line)."""
    flags: dict[str, Any] = {k: given[k] for k in OPTIONS if given.get(k) is not None}
    if given.get("env_kwargs") is not None:
        flags["env_kwargs"] = parse_env_kwargs(given["env_kwargs"])
    if not is_run_dir(model):
        return EvalInputs(model=model, **flags)
    run = run_eval_settings(model)
    if run.env is None and "env" not in flags:
        raise ConfigError(
            f"{run.run_dir / 'config.toml'}: env.mix: the run trained on several "
            "environments; pick one with --env (and --env-kwargs)"
        )
    from_run: dict[str, Any] = {
        "tasks": run.tasks,
        "split": run.split,
        "seed": run.seed,
        "max_new_tokens": run.max_new_tokens,
        "max_turns": run.max_turns,
        "episode": {k: v for k, v in run.episode.items() if k != "max_turns"},
        "grade_timeout_s": run.grade_timeout_s,
    }
    grader = None
    if flags.get("env", run.env) == run.env:  # the run's env: its kwargs, grader spec
        if run.function_env:
            raise ValueError(run.function_env_error())
        grader = run.grader()
        from_run |= {"env": run.env, "env_kwargs": run.env_kwargs, "grader": grader}
    threshold = run.pass_threshold(grader)
    if threshold is not None:
        from_run["pass_threshold"] = threshold
    checkpoint = run.checkpoint()
    return EvalInputs(model=str(checkpoint), run=run.run_dir, **(from_run | flags))
