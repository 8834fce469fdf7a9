"""`rldojo distill`: train a student towards a teacher's token distributions.

    rldojo distill --teacher runs/x/checkpoints/step_000012 --student smollm2-135m-instruct
                   --divergence reverse --sequences student --steps 20 --out distilled/

Forward KL on teacher sequences is classic soft-label distillation; reverse KL on
student sequences is on-policy distillation (see `rldojo.train.distill`). The student is
saved to ``OUT/student`` (loadable by every command), with metrics.jsonl and summary.json.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("distill")(distill)


def distill(
    teacher: Annotated[str, typer.Option(help="Teacher model: name, directory or checkpoint")],
    student: Annotated[str, typer.Option(help="Student model to train")],
    env: Annotated[str, typer.Option(help="Environment whose train prompts are used")] = (
        "arith-v1"
    ),
    env_kwargs: Annotated[str, typer.Option(help="JSON kwargs for the environment")] = "{}",
    divergence: Annotated[str, typer.Option(help="forward | reverse")] = "forward",
    sequences: Annotated[str, typer.Option(help="teacher | student (on-policy)")] = "teacher",
    steps: Annotated[int, typer.Option()] = 20,
    prompts_per_step: Annotated[int, typer.Option()] = 8,
    max_new_tokens: Annotated[int, typer.Option()] = 48,
    temperature: Annotated[float, typer.Option(help="Sampling temperature")] = 1.0,
    kd_temperature: Annotated[float, typer.Option(help="Softening τ in the loss")] = 1.0,
    lr: Annotated[float, typer.Option()] = 1e-5,
    micro_batch_size: Annotated[int, typer.Option()] = 8,
    grad_clip: Annotated[float, typer.Option()] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    out: Annotated[Path, typer.Option(help="Output directory")] = Path("distilled"),
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (1 helps on a busy machine)")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Move a run already in --out aside (NAME.old-DATE)")
    ] = False,
) -> None:
    """Distil a teacher into a student (forward or reverse KL, teacher or student sequences)."""
    from rldojo.commands.evaluation import set_threads
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.store.run_dir import claim_run_dir  # its RunDirError is a ValueError
    from rldojo.train.distill import DistillConfig
    from rldojo.train.distill import distill as run_distill

    if divergence not in ("forward", "reverse") or sequences not in ("teacher", "student"):
        fail("--divergence must be forward|reverse and --sequences teacher|student")
    set_threads(threads)
    o = dict(locals())
    errors: tuple[type[Exception], ...] = (*user_errors(), ValueError, json.JSONDecodeError)
    try:
        moved = claim_run_dir(out, command="distill", overwrite=overwrite)  # RunDirError
        if moved is not None:
            console.print(f"--overwrite: the run that was in {out} is now in {moved}")
        names = [f.name for f in fields(DistillConfig) if f.name != "env_kwargs"]
        cfg = DistillConfig(**{k: o[k] for k in names}, env_kwargs=json.loads(env_kwargs))

        def log(step: int, m: dict) -> None:
            console.print(
                f"step {step:>3} KL/token {m['loss/kl']:.4f} tokens {m['tokens']} "
                f"grad {m['optim/grad_norm']:.2f} {m['time/step']:.1f}s"
            )

        summary = run_distill(cfg, out, log=log)
    except errors as exc:
        fail(str(exc))
        return
    console.print(
        f"distilled {summary['steps']} steps: KL/token {summary['kl_first']} -> "
        f"{summary['kl_last']}; student saved to {summary['student_dir']}"
    )
