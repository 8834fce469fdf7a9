"""The training run: evaluate, step with a progress bar, checkpoint, evaluate, summarise.

`run_training` is what `rldojo train` calls. It owns the run directory layout:

    RUN/config.toml        the config as used (after --set overrides)
    RUN/metrics.jsonl      one JSON object per step ("kind": "train") and per evaluation
                           ("kind": "eval"); also the `run.report_to` sinks:
                           RUN/tensorboard/, RUN/wandb/, RUN/mlflow.db and
                           RUN/mlflow-artifacts/, their run ids in RUN/trackers.json
    RUN/samples.jsonl      a few graded samples per step (prompt, completion, reward and
                           its components, status), for reading
    RUN/ledger.sqlite      every graded rollout (durable, before training on it)
    RUN/checkpoints/       step_NNNNNN/ (safetensors + optimizer + RNG + step)
    RUN/evals/LABEL.jsonl  per held-out task of an evaluation ("before", "after",
                           "step_K"): task id, passed, value, status; runs evaluated on
                           the same tasks pair by task id (`benchmarks/agentic_pipeline.py`)
    RUN/summary.json       held-out accuracy before/after, timings, `stopped`: "steps"
                           (`run.steps` reached), "max_minutes" (`run.max_minutes` spent),
                           "failures" (the failure budget, `rldojo.train.failures`) or
                           "interrupted" (SIGINT/SIGTERM, `rldojo.train.interrupts`)
    RUN/config_history.jsonl  each start and resume, with the config keys it changed

A directory that holds a run is never written into by a new run (`rldojo.store.run_dir`).
Resuming (`--resume RUN`) continues from the newest checkpoint; everything a step logs,
evaluations included, is written before that step's checkpoint, so the log lines of later
steps are dropped on resume and written again as those steps are redone, from the
rollouts the ledger already holds (each step line says how many it reused).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rldojo.config import TrainConfig, load_config
from rldojo.report.metrics import MetricsLogger
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.store.files import write_atomically
from rldojo.store.run_dir import RunDirError, claim_run_dir, record_config_change, resume_changes
from rldojo.train.heldout import log_eval, save_eval_rows
from rldojo.train.interrupts import Interrupts
from rldojo.train.signal import signal_watch
from rldojo.train.stops import FailureBudgetExceeded, RunInterrupted
from rldojo.train.trainer import Trainer


def new_run_dir(config: TrainConfig) -> Path:
    name = config.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(config.run.output_dir) / name


def _step_line(step: int, m: dict[str, Any], pass_threshold: float = 1.0) -> str:
    g = m.get
    at = "" if pass_threshold == 1.0 else f"(>={pass_threshold:g})"
    return (
        f"step {step:>3} reward {g('reward/mean', 0):+.2f} pass{at} {g('reward/pass_rate', 0):.2f}"
        f" len {g('rollout/completion_len', 0):3.0f} H80 {g('entropy/p80', 0):.2f}"
        f" fork {g('entropy/tokens_selected', 0)}/{g('entropy/tokens_policy', 0)}"
        f" groups {g('rollout/groups_informative', 0)}/{g('rollout/groups', 0)}"
        f" gen {g('time/generate', 0):.0f}s train {g('time/train', 0):.0f}s"
        + _reused(g("rollout/reused"))
    )


def _reused(n: float | None) -> str:
    """Rollouts a step took from the ledger (a resumed run's), never silently."""
    return f" reused {n:.0f} rollouts from the ledger" if n else ""


def _trim_logs(run_dir: Path, step: int | None) -> None:
    """Keep the lines of `metrics.jsonl` and `samples.jsonl` up to `step` (None: none),
    dropping a line a crash cut short; each file is replaced whole."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = run_dir / name
        if not path.exists():
            continue
        kept = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if step is not None and record.get("step", 0) <= step:
                kept.append(line + "\n")
        write_atomically(path, "".join(kept))


def _write_samples(run_dir: Path, step: int, trainer: Trainer) -> None:
    with (run_dir / "samples.jsonl").open("a") as f:
        for row in trainer.ledger.samples(step - 1):
            f.write(json.dumps({"step": step, **row}) + "\n")


def run_training(
    config: TrainConfig,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    force: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train per `config`; returns the summary (also written to RUN/summary.json).

    A directory that holds a run is refused unless `resume` (then a config that changes
    what its rollouts mean is refused unless `force`) or `overwrite` (the old run is
    moved aside). Raises `FailureBudgetExceeded` or `RunInterrupted` (`rldojo.train.stops`)
    after writing the summary, when the run stopped for either."""
    console = console or Console()
    run_dir = run_dir or new_run_dir(config)
    changes = _claim(config, run_dir, resume=resume, overwrite=overwrite, force=force,
                     console=console)  # fmt: skip
    started = time.perf_counter()
    trainer = Trainer(config, run_dir, resume=resume)  # checks every input first
    record_config_change(run_dir, "resume" if resume else "start", changes)
    _print_header(console, config, trainer, run_dir)
    if resume:  # the steps after the checkpoint are redone, and logged again
        resumed = latest_checkpoint(run_dir / "checkpoints") is not None
        _trim_logs(run_dir, trainer.step_num if resumed else None)
    logger = MetricsLogger(
        run_dir,
        report_to=config.run.report_to,
        resume_step=trainer.step_num if resume else None,
        config=config.model_dump(mode="json"),
    )
    with Interrupts(lambda line: console.print(line, soft_wrap=True)) as interrupts:
        try:
            stopped = _run(config, trainer, logger, console, interrupts)
            summary = _finish(config, trainer, console, stopped, time.perf_counter() - started)
            if stopped == "interrupted":
                raise _interrupted_error(trainer)
            return summary
        except KeyboardInterrupt:  # a signal during an evaluation, or a second one
            if not interrupts.aborted and trainer.step_num > 0:  # its last step is committed
                _finish(config, trainer, console, "interrupted", time.perf_counter() - started)
            raise _interrupted_error(trainer, aborted=interrupts.aborted) from None
        except FailureBudgetExceeded:
            _finish(config, trainer, console, "failures", time.perf_counter() - started)
            raise
        finally:
            logger.close()
            trainer.close()


def _claim(config: TrainConfig, run_dir: Path, *, resume: bool, overwrite: bool, force: bool,
           console: Console) -> dict[str, tuple[Any, Any]]:  # fmt: skip
    """Check (or make) the run directory before anything starts; the config keys a resume
    changes. Raises `RunDirError` (one line) when the directory cannot be used."""
    moved = claim_run_dir(run_dir, command="train", resume=resume, overwrite=overwrite)
    if moved is not None:
        console.print(f"--overwrite: the run that was in {run_dir} is now in {moved}",
                      soft_wrap=True)  # fmt: skip
    if not resume:
        return {}
    stored = load_config(run_dir / "config.toml").model_dump(mode="json")
    meaning, harmless = resume_changes(stored, config.model_dump(mode="json"))
    said = "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in {**meaning, **harmless}.items())
    if meaning and not force:
        raise RunDirError(
            f"{run_dir}: resuming with this config would change what its ledger's rollouts "
            f"mean: {said}; start a new run (another run.name), or --force to resume anyway"
        )
    if said:
        console.print(f"resume: config changes {said} (config_history.jsonl)", soft_wrap=True)
    return {**meaning, **harmless}


def _print_header(console: Console, config: TrainConfig, trainer: Trainer, run_dir: Path) -> None:
    console.print(f"[bold]rldojo train[/] {config.model.name} on {config.env.id} -> {run_dir}")
    console.print(f"precision: {trainer.precision.describe()}", soft_wrap=True)
    console.print(f"threads: {trainer.threads.describe()}", soft_wrap=True)
    console.print(f"device: {trainer.device} (run.device = {config.run.device!r}); "
                  f"{_trainable(trainer.model)}", soft_wrap=True)  # fmt: skip


def _run(config: TrainConfig, trainer: Trainer, logger: MetricsLogger, console: Console,
         interrupts: Interrupts) -> str:  # fmt: skip
    """Evaluate before, train, evaluate after; which stopped the steps."""
    start = trainer.step_num
    if start == 0 and config.run.max_failure_rate < 1.0:
        stop = trainer.grader_preflight()
        if stop is not None:
            raise stop
    if config.eval.tasks and config.eval.before and "before" not in trainer.evals:
        with interrupts.immediate():
            result = trainer.evaluate("before")
        log_eval(console, logger, trainer.run_dir, "before", trainer.step_num, result)
    stopped = _train_steps(config, trainer, logger, console, interrupts)
    # Evaluated before the final checkpoint, which keeps the result: a run resumed
    # from that checkpoint has nothing left to do (and logs nothing twice).
    if (
        stopped != "interrupted"
        and config.eval.tasks
        and (trainer.step_num > start or "after" not in trainer.evals)
    ):
        with interrupts.immediate():
            result = trainer.evaluate("after")
        log_eval(console, logger, trainer.run_dir, "after", trainer.step_num, result)
    return stopped


def _finish(config: TrainConfig, trainer: Trainer, console: Console, stopped: str,
            wall_s: float) -> dict[str, Any]:  # fmt: skip
    """Checkpoint (unless the failure budget stopped the run: the checkpoints it has are
    kept), write and print the summary."""
    if stopped != "failures":
        trainer.save()
    summary = _summary(config, trainer, wall_s)
    summary["stopped"] = stopped
    (trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(console, summary)
    return summary


def _interrupted_error(trainer: Trainer, *, aborted: bool = False) -> RunInterrupted:
    """The one line of an interrupted run: where it stopped, what was saved, how to go on."""
    newest = latest_checkpoint(trainer.run_dir / "checkpoints")
    name = newest.name if newest is not None else None
    saved = "nothing saved" if name is None else (
        f"last checkpoint {name}" if aborted else f"checkpoint {name}")  # fmt: skip
    how = "aborted" if aborted else "interrupted"
    message = (f"{how} at step {trainer.step_num}; {saved}; resume with: "
               f"rldojo train --resume {trainer.run_dir}")  # fmt: skip
    return RunInterrupted(message, step=trainer.step_num, checkpoint=name)


def _train_steps(config: TrainConfig, trainer: Trainer, logger: MetricsLogger, console: Console,
                 interrupts: Interrupts) -> str:  # fmt: skip
    """Step to `run.steps`, or until `run.max_minutes` is spent or a signal asks to stop;
    returns which stopped it ("steps", "max_minutes" or "interrupted"). Raises the
    failure budget's stop after logging the step that spent it."""
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("training", total=config.run.steps, completed=trainer.step_num)
        budget = None if config.run.max_minutes is None else 60 * config.run.max_minutes
        started = time.perf_counter()
        watch = signal_watch(config, trainer.envs)  # says why a step had no signal
        while trainer.step_num < config.run.steps:
            metrics = trainer.step()
            logger.log(trainer.step_num, metrics)
            _write_samples(trainer.run_dir, trainer.step_num, trainer)
            progress.console.print(
                _step_line(trainer.step_num, metrics, trainer.pass_threshold), soft_wrap=True
            )
            if (why := watch.observe(trainer.step_num, metrics)) is not None:
                progress.console.print(why, soft_wrap=True, markup=False)
            if trainer.over_budget is not None:
                raise trainer.over_budget
            if interrupts.requested is not None:
                return "interrupted"
            spent = budget is not None and time.perf_counter() - started >= budget
            last = trainer.step_num >= config.run.steps or spent  # evaluated as "after"
            if config.eval.every and trainer.step_num % config.eval.every == 0 and not last:
                label = f"step_{trainer.step_num}"
                with interrupts.immediate():
                    result = trainer.evaluate(label)
                logger.log(trainer.step_num, result.metrics(), kind="eval")
                save_eval_rows(trainer.run_dir, label, result)
            every = config.run.checkpoint_every  # after the step's logs and evaluation
            if every and trainer.step_num % every == 0 and not last:
                trainer.save()
            progress.update(bar, completed=trainer.step_num)
            if spent and trainer.step_num < config.run.steps:
                progress.console.print(f"run.max_minutes = {config.run.max_minutes:g} spent: "
                                       f"stopping after step {trainer.step_num}")  # fmt: skip
                return "max_minutes"
    return "steps"


def _trainable(model: Any) -> str:
    """'full fine-tuning, N parameters' or 'LoRA: N of M parameters train'."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trained == total:
        return f"full fine-tuning, {total / 1e6:.1f}M parameters"
    return f"LoRA: {trained / 1e6:.2f}M of {total / 1e6:.1f}M parameters train"


def _summary(config: TrainConfig, trainer: Trainer, wall_s: float) -> dict[str, Any]:
    steps = trainer.ledger.step_metrics()
    step_times = [m["time/step"] for m in steps if "time/step" in m]
    return {
        "model": config.model.name,
        "env": config.env.id,
        "steps": trainer.step_num,
        "accuracy_before": trainer.evals.get("before", {}).get("accuracy"),
        "accuracy_after": trainer.evals.get("after", {}).get("accuracy"),
        "evals": trainer.evals,
        "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
        "wall_s": wall_s,
        "rollouts": trainer.ledger.count(),
        "rollouts_trained": trainer.ledger.count(trained=True),
        "statuses": trainer.ledger.status_counts(),
        "run_dir": str(trainer.run_dir),
        "precision": trainer.precision.as_dict(),
        "device": str(trainer.device),
        "threads": trainer.threads.as_dict(),
    }


def _print_summary(console: Console, s: dict[str, Any]) -> None:
    table = Table(title="rldojo train: summary", show_header=False)
    for key in (
        "model",
        "env",
        "steps",
        "accuracy_before",
        "accuracy_after",
        "mean_step_s",
        "wall_s",
        "rollouts",
        "rollouts_trained",
        "statuses",
        "run_dir",
    ):
        value = s.get(key)
        if isinstance(value, float):
            value = f"{value:.1%}" if key.startswith("accuracy") else f"{value:.1f}"
        table.add_row(key, str(value))
    console.print(table)
