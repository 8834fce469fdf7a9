"""Runs from Python: `train`, `sft` and `distill`, their config and their result.

    import rldojo

    def correct(prompt, completion, answer):
        return float(completion.strip().startswith(answer))

    rows = [{"prompt": "2 + 2 =", "answer": "4"}, {"prompt": "3 + 5 =", "answer": "8"}]
    result = rldojo.train({"model": {"name": "tiny-random"}, "run": {"steps": 2}},
                          tasks=rows, reward=correct)
    result.checkpoint, result.summary["statuses"], result.metrics()
    rldojo.evaluate(result.run_dir, tasks=rows, reward=correct).accuracy

Each call runs what the CLI command runs: the same config (a TOML path, a dict of its
sections, or a `TrainConfig`), checked with the same one-line errors, the same run
directory, the same exceptions (`rldojo.training.stops`). What the CLI prints, a call
logs through the standard `logging` module (logger `rldojo.run`, a
`rldojo.training.callbacks.LoggingCallback`): a step without learning signal at WARNING,
which Python prints on stderr when logging is left unconfigured; the header, step and
evaluation lines at INFO. Nothing is printed by the call itself, on a terminal or not;
with a `ConsoleCallback` among `callbacks` it prints as the CLI does instead (and logs
nothing twice). `RunResult.diagnosis` says which steps had no learning signal, and why.
The reward-function shortcut is an environment like any other
(`rldojo.envs.function_reward`). docs/api.md is the user's page.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rldojo.api.model_args import with_model
from rldojo.config import ConfigError, ConfigValueError, TrainConfig, load_config
from rldojo.config.base import format_error
from rldojo.envs.function_reward import Rewards, register_function_env
from rldojo.training.callbacks import quiet_progress_bars

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rldojo.training.callbacks import Callback
    from rldojo.training.no_signal import NoSignal

__all__ = [
    "RunResult",
    "as_config",
    "distill",
    "quiet_progress_bars",
    "sft",
    "train",
    "with_reward",
]

ConfigLike = str | os.PathLike[str] | Mapping[str, Any] | TrainConfig
"""A TOML file, a dict of its sections (`{"model": {"name": ...}, "run": {...}}`), or a
`TrainConfig`."""

Rows = Iterable[Mapping[str, Any]]
"""Tasks as rows: a list of dicts or a `datasets.Dataset` (`rldojo.envs.function_reward`)."""


def as_config(config: ConfigLike) -> TrainConfig:
    """The `TrainConfig` of a path, a dict of sections or a config; a bad key or value is
    a `ConfigError` of one line (`config: run.steps: Input should be ...` for a dict)."""
    if isinstance(config, TrainConfig):
        return config
    if isinstance(config, Mapping):
        from pydantic import ValidationError

        try:
            return TrainConfig.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigError(format_error("config", exc, TrainConfig)) from None
    if isinstance(config, str | os.PathLike):
        return load_config(Path(config))
    raise TypeError(
        f"config: expected a TOML path, a dict or a TrainConfig, got {type(config).__name__}"
    )


@dataclass(frozen=True)
class RunResult:
    """A finished run: its directory and what `RUN/summary.json` holds."""

    run_dir: Path
    summary: dict[str, Any]
    """What `RUN/summary.json` holds (the keys depend on the command)."""
    accuracy_before: float | None
    """Held-out accuracy of the starting model (None: not evaluated)."""
    accuracy_after: float | None
    """Held-out accuracy at the end (None: not evaluated)."""
    stopped: str | None
    """Why the run ended: "steps", "max_minutes", "callback", ... (`summary["stopped"]`)."""
    checkpoint: Path | None
    """The newest checkpoint, `RUN/checkpoints/step_NNNNNN` (None: none written)."""
    diagnosis: tuple[NoSignal, ...] = ()
    """The steps without learning signal, grouped by cause (`train`; summary.json's
    `no_signal`): each a `rldojo.training.no_signal.NoSignal` with `cause` ("too_easy",
    "too_hard", "truncated", "no_answer", "constant_reward", "equal_groups", "failures"),
    `steps` and `text`. Empty: every step had signal, or the command has no groups."""

    @classmethod
    def of(cls, summary: Mapping[str, Any], run_dir: str | os.PathLike[str] | None) -> RunResult:
        """The result of a run that returned `summary` (its `run_dir`, else the one given)."""
        from rldojo.store.checkpoint import latest_checkpoint
        from rldojo.training.no_signal import NoSignal

        where = run_dir if run_dir is not None else summary.get("run_dir")
        if where is None:
            raise ValueError("the run's summary names no run directory")
        path = Path(where)
        return cls(
            run_dir=path,
            summary=dict(summary),
            accuracy_before=summary.get("accuracy_before"),
            accuracy_after=summary.get("accuracy_after"),
            stopped=summary.get("stopped"),
            checkpoint=latest_checkpoint(path / "checkpoints"),
            diagnosis=tuple(NoSignal.from_dict(d) for d in summary.get("no_signal", ())),
        )

    def metrics(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The records of `RUN/metrics.jsonl` (each step's, each evaluation's), those of
        `kind` ("train", "eval", "sft", ...) when given; a line cut short is skipped."""
        import json

        path = self.run_dir / "metrics.jsonl"
        records = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if kind is None or record.get("kind") == kind:
                records.append(record)
        return records


def _heard(callbacks: Sequence[Callback]) -> list[Callback]:
    """`callbacks`, and a `LoggingCallback` unless a `ConsoleCallback` prints the run."""
    from rldojo.training.callbacks import ConsoleCallback, LoggingCallback

    printed = any(isinstance(c, ConsoleCallback) for c in callbacks)
    return [*callbacks, *([] if printed else [LoggingCallback()])]


def _dir(run_dir: str | os.PathLike[str] | None) -> Path | None:
    return None if run_dir is None else Path(run_dir)


def train(
    config: ConfigLike,
    *,
    callbacks: Sequence[Callback] = (),
    run_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    tasks: Rows | None = None,
    eval_tasks: Rows | None = None,
    reward: Rewards | None = None,
    reward_weights: Sequence[float] | None = None,
    model: str | PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    peft_config: LoraConfig | None = None,
) -> RunResult:
    """Train with reinforcement learning (`rldojo train`). With `tasks` and `reward` the
    environment is those rows graded by that function, or by the weighted sum of several
    (`reward_weights`, TRL's name; default 1.0 each; `rldojo.envs.reward_functions`);
    `eval_tasks`: the held-out rows, `eval.tasks` = their number (none: no held-out
    evaluation); it replaces `[env]`.
    `model` (a name or a `PreTrainedModel`, trained in place), `tokenizer` and
    `peft_config` (a `peft.LoraConfig`) are TRL's arguments (`rldojo.api.model_args`).

    A directory that holds a run is refused (`RunDirError`) unless `resume` or
    `overwrite`; a run stopped by its failure budget or a signal raises after writing its
    summary (`rldojo.training.stops`)."""
    cfg = as_config(config)
    if model is not None or tokenizer is not None or peft_config is not None:
        cfg = with_model(cfg, model, tokenizer, peft_config)
    if any(x is not None for x in (reward, tasks, eval_tasks, reward_weights)):
        cfg = with_reward(cfg, reward, tasks, eval_tasks, reward_weights)  # checked before any work
    from rldojo.training.loop import run_training

    with quiet_progress_bars():
        summary = run_training(
            cfg,
            run_dir=_dir(run_dir),
            resume=resume,
            overwrite=overwrite,
            force=False,
            callbacks=_heard(callbacks),
        )
    return RunResult.of(summary, run_dir)


def with_reward(
    config: TrainConfig,
    reward: Rewards | None,
    tasks: Rows | None,
    eval_tasks: Rows | None,
    reward_weights: Sequence[float] | None = None,
) -> TrainConfig:
    """`config` training on `tasks` graded by `reward`: the rows are checked and their
    environment registered in this process (`register_function_env`). A config that an
    earlier `train()` wrote (its `env.kwargs` the fingerprint of its rows) may be given."""
    if reward is None or tasks is None:
        raise ValueError(
            "train: tasks= and reward= go together (rows, and the function "
            "that grades a completion of one)"
        )
    refused = {
        "rollout.env_workers": (config.rollout.env_workers > 0, "set it to 0"),
        "rollout.grade_in_workers": (config.rollout.grade_in_workers, "set it to false"),
        "run.cluster": (config.run.cluster == "ray", 'leave it "local"'),
    }
    for key, (bad, fix) in refused.items():
        if bad:
            raise ConfigValueError(
                f"{key}: a reward function lives in this process and cannot "
                f"reach other processes; {fix}"
            )
    written = config.env.id.startswith("reward.") and set(config.env.kwargs) <= {"fingerprint"}
    for key, bad in (
        ("env.mix", bool(config.env.mix)),
        ("env.kwargs", bool(config.env.kwargs) and not written),
        ("grader.spec", config.grader.spec is not None),
    ):
        if bad:
            raise ConfigValueError(
                f"{key}: the tasks and reward given to train() are the "
                "environment and its grader; leave it unset"
            )
    made = register_function_env(
        reward, tasks, eval_tasks, weights=reward_weights, group_size=config.rollout.group_size
    )
    return config.model_copy(
        update={
            "env": config.env.model_copy(update={"id": made.env_id, "kwargs": made.kwargs}),
            "eval": config.eval.model_copy(update={"tasks": made.eval_tasks}),
        }
    )


def sft(
    config: ConfigLike,
    *,
    data: str | os.PathLike[str] | None = None,
    callbacks: Sequence[Callback] = (),
    run_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    model: str | PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    peft_config: LoraConfig | None = None,
) -> RunResult:
    """Supervised fine-tuning on demonstrations (`rldojo sft`): `data` is a JSONL file of
    conversations (`rldojo demos` writes them); None: `sft.data`. `model`, `tokenizer` and
    `peft_config` as `train` takes them."""
    from rldojo.training.sft import run_sft

    cfg = as_config(config)
    sft_model = cfg.sft.model
    if (
        peft_config is not None
        and sft_model is not None
        and sft_model.lora is None
        and "lora" in sft_model.model_fields_set
    ):
        raise ConfigValueError(
            'sft.model.lora: "none" trains every weight, but peft_config= '
            "asks for adapters; leave it out"
        )
    if model is not None or tokenizer is not None or peft_config is not None:
        cfg = with_model(cfg, model, tokenizer, peft_config)
    with quiet_progress_bars():
        summary = run_sft(
            cfg,
            data,
            run_dir=_dir(run_dir),
            resume=resume,
            overwrite=overwrite,
            callbacks=_heard(callbacks),
        )
    return RunResult.of(summary, run_dir)


def distill(
    config: ConfigLike,
    *,
    callbacks: Sequence[Callback] = (),
    run_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> RunResult:
    """Distillation towards `distill.teacher` (`rldojo distill`)."""
    from rldojo.training.distill import run_distill

    cfg = as_config(config)
    with quiet_progress_bars():
        summary = run_distill(
            cfg,
            run_dir=_dir(run_dir),
            resume=resume,
            overwrite=overwrite,
            callbacks=_heard(callbacks),
        )
    return RunResult.of(summary, run_dir)
