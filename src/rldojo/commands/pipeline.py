"""`rldojo pipeline`: demonstrations -> SFT -> RL -> the stages compared, from one TOML.

    rldojo pipeline examples/agentic_tictactoe.toml [--set k=v ...] [--demos 128]
                    [--run-dir DIR] [--overwrite] [--by-kind mark]

The three commands of an `examples/agentic_*.toml` header (`rldojo demos`, `rldojo sft`,
`rldojo train` from the SFT checkpoint with `eval.before=false`) in one directory, each
stage reading the same config and `--set` overrides, then PIPE/summary.json: base, SFT
and SFT+RL success on the same held-out tasks with the paired tests between them. The
same command again resumes: completed stages are skipped. See `rldojo.training.pipeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    """Add `rldojo pipeline` to the app."""
    app.command("pipeline")(pipeline)


def pipeline(
    config: Annotated[Path, typer.Argument(help="TOML config with \\[sft] (as for rldojo sft)")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override for every stage, e.g. run.steps=8")
    ] = None,
    demos: Annotated[int, typer.Option(help="Expert episodes to play (the SFT data)")] = 100,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Pipeline directory (default: run.output_dir/run.name-pipeline)"),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Move a pipeline already in the directory aside and start over")
    ] = False,
    by_kind: Annotated[
        str | None,
        typer.Option(help="Also count passes per value of the test tasks' info[KEY], e.g. mark"),
    ] = None,
) -> None:
    """Demos, SFT, then RL from the SFT checkpoint; compare the three on the same tasks.

    Exit codes: 0 done, 2 bad input (nothing started), 1 failed, 130 interrupted (the
    same command resumes)."""
    from rldojo.commands.ui import console, fail, stop, user_errors
    from rldojo.config import ConfigError
    from rldojo.store.run_dir import RunDirError
    from rldojo.training.pipeline import run_pipeline
    from rldojo.training.stops import RunStopped

    if demos < 1:
        fail("--demos must be >= 1")
    try:
        summary = run_pipeline(
            config,
            set_ or [],
            run_dir,
            demos=demos,
            group_by=by_kind,
            overwrite=overwrite,
            console=console,
        )
    except RunStopped as exc:
        stop(exc, " (rldojo pipeline: the same command resumes)")
        return
    except (ConfigError, RunDirError) as exc:
        fail(str(exc))
        return
    except user_errors() as exc:  # a data error names its file; the others are the config's
        from rldojo.data.loading import DataError

        fail(str(exc) if isinstance(exc, DataError) else f"{config}: {exc}")
        return
    console.print(_line(summary), soft_wrap=True)


def _line(summary: dict[str, Any]) -> str:
    """`base 0.0% -> SFT 25.0% -> SFT+RL 50.0% (SFT -> RL: McNemar p=0.5)`."""

    def rate(stage: str) -> str:
        s = summary["success"][stage]
        return "-" if s is None else f"{s['rate']:.1%} ({s['passed']}/{s['n']})"

    paired = summary["paired"]["sft_to_sft_rl"]
    p = "" if paired is None else f" (SFT -> RL: McNemar p={paired['mcnemar']['p_value']:.3g})"
    out = Path(summary["runs"]["rl"]).parent / "summary.json"
    return f"base {rate('base')} -> SFT {rate('sft')} -> SFT+RL {rate('sft_rl')}{p} -> {out}"
