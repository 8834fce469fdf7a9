"""`rldojo train`: forking-token GRPO on a TOML config, new or resumed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from rldojo.commands.ui import (
    check_envs_early,
    console,
    fail,
    relaunch_on_ranks,
    stop,
    user_errors,
)
from rldojo.config import ConfigError, TrainConfig, blame, load_config


def register(app: typer.Typer) -> None:
    app.command()(train)


def train(
    config: Annotated[
        Path | None, typer.Argument(help="TOML config (default: the quickstart)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. loss.rho=1.0")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Resume the run in this directory from its newest checkpoint"),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(help="Move a run already in the run directory aside (NAME.old-DATE)"),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            help="With --resume: resume although the config changes what the "
            "ledger's rollouts mean (model, env, sampling, grader, groups)"
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Validate, print the resolved config and plan; write nothing"
        ),
    ] = False,
    allow_download: Annotated[
        bool, typer.Option("--allow-download", help="Let a hub model id be downloaded")
    ] = False,
    nproc: Annotated[
        int | None,
        typer.Option(help="Train on N ranks of this machine (torchrun; FSDP2, run.shard)"),
    ] = None,
) -> None:
    """Train a policy with forking-token GRPO (default: SmolLM2-135M on arith-v1).

    Exit codes: 0 done, 2 bad input (nothing started), 1 the run failed (e.g. the failure
    budget), 130 interrupted (resume with --resume RUN_DIR)."""
    from rldojo.store.run_dir import RunDirError
    from rldojo.training.stops import RunStopped

    if allow_download:
        os.environ["RLDOJO_ALLOW_DOWNLOAD"] = "1"
    relaunch_on_ranks(nproc)
    path = config or (resume / "config.toml" if resume is not None else None)
    try:
        cfg = _load(config, set_ or [], resume)
        check_envs_early(cfg)  # a typo answers before torch is imported (seconds)
        _run(cfg, resume=resume, dry_run=dry_run, overwrite=overwrite, force=force)
    except RunStopped as exc:  # the failure budget, an interrupt: summary.json says which
        stop(exc)
    except (ConfigError, RunDirError) as exc:
        fail(str(exc))
    except user_errors() as exc:  # the config's values were wrong: say which file or --set
        fail(blame(str(exc), path, set_ or []))


def _run(
    cfg: TrainConfig, *, resume: Path | None, dry_run: bool, overwrite: bool, force: bool
) -> None:
    """Plan (`--dry-run`), resume or start the run; the trainer is imported only now."""
    from rldojo.training.loop import run_training

    if dry_run:
        from rldojo.training.dry_run import dry_run as describe

        describe(cfg, console)
    elif resume is not None:
        run_training(cfg, run_dir=resume, resume=True, force=force, console=console)
    else:
        run_training(cfg, overwrite=overwrite, console=console)


def _load(config: Path | None, overrides: list[str], resume: Path | None) -> TrainConfig:
    """The config of a new run (`config`, else the defaults) or of the run `resume`
    continues (its own config.toml, unless `config` is given), with `overrides`."""
    if resume is None:
        cfg = load_config(config, overrides)
        _note_defaults(config, overrides)
        return cfg
    if not (resume / "config.toml").exists():
        fail(f"{resume}: not a run directory (no config.toml) to resume")
    return load_config(config or resume / "config.toml", overrides)


def _note_defaults(config: Path | None, overrides: list[str]) -> None:
    """A config file without [model] or [run] trains the quickstart's model and length:
    say so rather than start a long default run silently."""
    if config is None:
        return
    import tomllib

    data = tomllib.loads(config.read_text())
    for section, what in (("model", "model smollm2-135m-instruct"), ("run", "12 steps")):
        if section not in data and not any(o.startswith(f"{section}.") for o in overrides):
            console.print(
                f"note: {config} has no \\[{section}]: using the default ({what})", soft_wrap=True
            )
