"""`rldojo sft`: supervised fine-tuning on demonstrations, the cold start before RL.

    rldojo demos examples/agentic_crm.toml --n 300 --out demos.jsonl
    rldojo sft examples/agentic_crm.toml --data demos.jsonl
    rldojo sft --resume runs/agentic-crm-sft      # after an interrupt or a crash
    rldojo train examples/agentic_crm.toml \
        --set model.name=runs/agentic-crm-sft/checkpoints/step_000038

The config is the one `rldojo train` reads (`[model]`, `[optim]`, `[eval]`, `[env]`,
`[run]`) plus its `[sft]` section (`rldojo.config.sft`); the run directory is
`run.output_dir/run.name` with `-sft` appended to the name. See `rldojo.training.sft`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from rldojo.commands.ui import check_envs_early, console, fail, relaunch_on_ranks, stop, user_errors


def register(app: typer.Typer) -> None:
    app.command("sft")(sft)


def sft(
    config: Annotated[Path | None, typer.Argument(help="TOML config (as for rldojo train)")] = None,
    data: Annotated[
        Path | None, typer.Option(help="Demonstrations (JSONL, from rldojo demos)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. run.epochs=3")
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Run directory (default: run.output_dir/run.name-sft, or a timestamp)"),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(help="Move a run already in the run directory aside (NAME.old-DATE)"),
    ] = False,
    resume: Annotated[
        Path | None,
        typer.Option(help="Resume the run in this directory from its newest checkpoint"),
    ] = None,
    nproc: Annotated[
        int | None,
        typer.Option(help="Train on N ranks of this machine (torchrun; FSDP2, run.shard)"),
    ] = None,
) -> None:
    """Fine-tune on demonstrations: loss on assistant tokens only, the RL tokenisation.

    Exit codes: 0 done, 2 bad input (nothing started), 1 failed, 130 interrupted."""
    from rldojo.config import ConfigError, blame, load_config
    from rldojo.store.run_dir import RunDirError
    from rldojo.training.stops import RunStopped

    relaunch_on_ranks(nproc)
    try:
        if resume is not None:
            if not (resume / "config.toml").exists():
                fail(f"{resume}: not a run directory (no config.toml) to resume")
            config, run_dir = config or resume / "config.toml", resume
        cfg = load_config(config, set_ or [])
        check_envs_early(cfg)  # before torch is imported
        from rldojo.training.sft import run_sft

        if run_dir is None and cfg.run.name:
            run_dir = Path(cfg.run.output_dir) / f"{cfg.run.name}-sft"
        summary = run_sft(
            cfg,
            data,
            run_dir=run_dir,
            resume=resume is not None,
            overwrite=overwrite,
            console=console,
        )
        if os.environ.get("RANK", "0") == "0":  # on several ranks, rank 0 says it
            console.print(
                f"next: rldojo train CONFIG --set model.name={summary['checkpoint']}",
                soft_wrap=True,
            )
    except RunStopped as exc:
        stop(exc)
    except (ConfigError, RunDirError) as exc:
        fail(str(exc))
    except user_errors() as exc:  # a data error names its file; the others are the config's
        from rldojo.data.loading import DataError

        fail(str(exc) if isinstance(exc, DataError) else blame(str(exc), config, set_ or []))
