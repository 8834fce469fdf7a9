"""`rldojo distill`: train a student towards a teacher's token distributions.

    rldojo distill --teacher runs/x/checkpoints/step_000012 --student smollm2-135m-instruct
                   --divergence reverse --sequences student --steps 20 --out distilled/
    rldojo distill examples/quickstart.toml --set distill.teacher=runs/x/checkpoints/...
    rldojo distill --resume distilled/             # after an interrupt or a crash

Forward KL on teacher sequences is classic soft-label distillation; reverse KL on
student sequences is on-policy distillation (see `rldojo.training.distill`). The config is
the one `rldojo train` reads (the student is `[model]`, prompts from `[env]`) plus its
`[distill]` section; each option below is a shortcut for the config key it names. The run
directory holds checkpoints (the last one loadable by every command), metrics.jsonl and
summary.json, as `rldojo train`'s does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rldojo.commands.ui import check_envs_early, console, fail, parse_env_kwargs, stop, user_errors
from rldojo.training.stops import RunStopped

_KEYS = {  # option -> config key
    "teacher": "distill.teacher", "student": "model.name", "env": "env.id",
    "divergence": "distill.divergence", "sequences": "distill.sequences", "steps": "run.steps",
    "batch_size": "distill.batch_size", "max_new_tokens": "sampling.max_new_tokens",
    "temperature": "sampling.temperature", "kd_temperature": "distill.kd_temperature",
    "lr": "optim.lr", "micro_batch_size": "optim.micro_batch_size",
    "grad_clip": "optim.grad_clip", "seed": "run.seed", "threads": "run.threads",
}  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("distill")(distill)


def distill(
    config: Annotated[Path | None, typer.Argument(help="TOML config (as for rldojo train)")] = None,
    teacher: Annotated[
        str | None, typer.Option(help="distill.teacher: name, dir or checkpoint")
    ] = None,
    student: Annotated[str | None, typer.Option(help="model.name: the student to train")] = None,
    env: Annotated[str | None, typer.Option(help="env.id: whose train prompts are used")] = None,
    env_kwargs: Annotated[str | None, typer.Option(help="env.kwargs as JSON")] = None,
    divergence: Annotated[
        str | None, typer.Option(help="distill.divergence: forward | reverse")
    ] = None,
    sequences: Annotated[
        str | None, typer.Option(help="distill.sequences: teacher | student")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="run.steps")] = None,
    batch_size: Annotated[int | None, typer.Option(help="distill.batch_size")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="sampling.max_new_tokens")] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling.temperature")] = None,
    kd_temperature: Annotated[float | None, typer.Option(help="distill.kd_temperature τ")] = None,
    lr: Annotated[float | None, typer.Option(help="optim.lr")] = None,
    micro_batch_size: Annotated[int | None, typer.Option(help="optim.micro_batch_size")] = None,
    grad_clip: Annotated[float | None, typer.Option(help="optim.grad_clip")] = None,
    seed: Annotated[int | None, typer.Option(help="run.seed")] = None,
    threads: Annotated[int | None, typer.Option(help="run.threads")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. run.steps=4")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Run directory (default: run.output_dir/run.name-distill, or a timestamp)"
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Move a run already in --out aside (NAME.old-DATE)")
    ] = False,
    resume: Annotated[
        Path | None,
        typer.Option(help="Resume the run in this directory from its newest checkpoint"),
    ] = None,
) -> None:
    """Distil a teacher into a student (forward or reverse KL, teacher or student sequences).

    Exit codes: 0 done, 2 bad input (nothing started), 1 failed, 130 interrupted."""
    from rldojo.config import ConfigError, load_config
    from rldojo.store.run_dir import RunDirError

    given = {k: v for k, v in locals().items() if k in _KEYS and v is not None}
    overrides = [f"{_KEYS[k]}={_toml(v)}" for k, v in given.items()]
    if env_kwargs is not None:
        try:
            overrides.append(f"env.kwargs={_toml(parse_env_kwargs(env_kwargs))}")
        except ValueError as exc:
            fail(str(exc))
    if resume is not None:
        if not (resume / "config.toml").exists():
            fail(f"{resume}: not a run directory (no config.toml) to resume")
        config, out = config or resume / "config.toml", resume
    source = str(config) if config is not None else "defaults"
    errors: tuple[type[Exception], ...] = (*user_errors(), ValueError)  # the tokenizers differ
    try:
        cfg = load_config(config, [*overrides, *(set_ or [])])
        check_envs_early(cfg)  # before torch is imported
        from rldojo.training.distill import run_distill

        if out is None and cfg.run.name:
            out = Path(cfg.run.output_dir) / f"{cfg.run.name}-distill"
        summary = run_distill(
            cfg, run_dir=out, resume=resume is not None, overwrite=overwrite, console=console
        )
    except RunStopped as exc:
        stop(exc)
    except (ConfigError, RunDirError) as exc:
        fail(str(exc))
    except errors as exc:
        fail(f"{source}: {exc}")
    console.print(
        f"distilled {summary['steps']} steps: KL/token {summary['kl_first']} -> "
        f"{summary['kl_last']}; student: {summary['checkpoint']}",
        soft_wrap=True,
    )


def _toml(value: object) -> str:
    """A TOML literal for `--set` (strings quoted, dicts as inline tables)."""
    import json

    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str | list) else str(value)
