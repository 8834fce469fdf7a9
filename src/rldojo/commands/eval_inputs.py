"""What `rldojo eval` evaluates: the model, the environment, its kwargs and the episode
limits, each from the command line, else from the run directory given as the model,
else the built-in default.

A run directory (`rldojo train`'s or `rldojo sft`'s: `RUN/config.toml`, checkpoints in
`RUN/checkpoints/step_NNNNNN`) stands for its newest checkpoint
(`rldojo.store.checkpoint.latest_checkpoint`), and its `config.toml` gives what the run's
own held-out evaluation used: `env.id`, `env.kwargs` (the prompt format lives there: the
system prompt, the answer format, the tool schema style, ...), `eval.max_new_tokens` (or
`sampling.max_new_tokens`) and `rollout.max_turns`. So

    rldojo eval --model runs/agentic-crm --tasks 48

evaluates the run's last weights on the tasks and prompts it trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rldojo.commands.ui import parse_env_kwargs
from rldojo.config import ConfigError, load_config
from rldojo.policy.models import ModelLoadError
from rldojo.store.checkpoint import latest_checkpoint


@dataclass(frozen=True)
class EvalInputs:
    """The resolved inputs; `run` is the run directory the model came from, if any."""

    model: str
    env: str = "arith-v1"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 48
    max_turns: int = 8
    run: Path | None = None


def is_run_dir(spec: str | None) -> bool:
    """Whether a model spec names a run directory (one with a `config.toml`)."""
    return spec is not None and (Path(spec).expanduser() / "config.toml").is_file()


def newest_checkpoint(run: Path) -> Path:
    """The run's newest complete checkpoint; a `ModelLoadError` when it has none yet."""
    checkpoint = latest_checkpoint(run / "checkpoints")
    if checkpoint is None:
        raise ModelLoadError(f"model {str(run)!r}: a run directory without a checkpoint yet "
                             "(RUN/checkpoints/step_NNNNNN)")  # fmt: skip
    return checkpoint


def resolve(
    model: str,
    env: str | None,
    env_kwargs: str | None,
    max_new_tokens: int | None,
    max_turns: int | None,
) -> EvalInputs:
    """The inputs of one evaluation (see the module docstring); None: not given on the
    command line. `env_kwargs` is JSON; the run's kwargs apply only to the run's env."""
    given = _given(env, env_kwargs, max_new_tokens, max_turns)
    if not is_run_dir(model):
        return EvalInputs(model=model, **given)
    run = Path(model).expanduser()
    checkpoint = newest_checkpoint(run)
    config = load_config(run / "config.toml")
    from_run: dict[str, Any] = {
        "max_new_tokens": config.eval.max_new_tokens or config.sampling.max_new_tokens,
        "max_turns": config.rollout.max_turns,
    }
    if config.env.mix and env is None:
        raise ConfigError(f"{run / 'config.toml'}: env.mix: the run trained on several "
                          "environments; pick one with --env (and --env-kwargs)")  # fmt: skip
    if not config.env.mix and env in (None, config.env.id):
        from_run |= {"env": config.env.id, "env_kwargs": dict(config.env.kwargs)}
    return EvalInputs(model=str(checkpoint), run=run, **(from_run | given))


def _given(
    env: str | None, env_kwargs: str | None, max_new_tokens: int | None, max_turns: int | None
) -> dict[str, Any]:
    given: dict[str, Any] = {"env": env, "max_new_tokens": max_new_tokens, "max_turns": max_turns}
    if env_kwargs is not None:
        given["env_kwargs"] = parse_env_kwargs(env_kwargs)
    return {k: v for k, v in given.items() if v is not None}
