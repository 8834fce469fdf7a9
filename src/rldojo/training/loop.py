"""The run loop: evaluate, step, checkpoint, evaluate, summarise — for every objective.

`run_loop(build_objective, ...)` runs an objective (`rldojo.training.objective`: GRPO, SFT
or distillation) the same way: the run directory guard and resume rules, the "before"
evaluation, steps to `total_steps` (or `run.max_minutes`, a signal, a callback's
`should_stop`, the failure budget), evaluations every `eval.every` steps, checkpoints
every `run.checkpoint_every` steps and at the end, "after", `summary.json`. It prints
nothing: what it says goes to its callbacks (`rldojo.training.callbacks`), `metrics.jsonl`
and the trackers included; while an evaluation runs, how far it got (`on_eval_progress`),
and while the objective is built, what `BUILD_LOGGERS` log (`on_message`). `run_training`
is what `rldojo train` calls. The layout:

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
                           "failures" (the failure budget, `rldojo.training.failure_budget`) or
                           "interrupted" (SIGINT/SIGTERM, `rldojo.training.interrupts`);
                           for `train`, `no_signal`: the steps without learning signal by
                           cause (`rldojo.training.no_signal.no_signal_report`)
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
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rldojo.config import TrainConfig, load_config
from rldojo.report.metrics import MetricsLogger
from rldojo.report.progress import log_lines, with_turn
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.store.files import write_atomically
from rldojo.store.run_dir import RunDirError, claim_run_dir, record_config_change, resume_changes
from rldojo.training.callbacks import (
    Callback,
    CallbackList,
    ConsoleCallback,
    LoggingCallback,
    MetricsCallback,
    quiet_progress_bars,
)
from rldojo.training.distributed import Dist, init_dist, world_size_from_env
from rldojo.training.heldout import save_eval_rows
from rldojo.training.interrupts import Interrupts
from rldojo.training.objective import Objective
from rldojo.training.run import Run
from rldojo.training.stops import FailureBudgetExceeded, RunInterrupted, RunStopped

__all__ = ["BUILD_LOGGERS", "new_run_dir", "on_ray_ranks", "run_loop", "run_training"]

BUILD_LOGGERS = ("rldojo.policy.models", "rldojo.training.demo_data")
"""What an objective's build logs (INFO) goes to the callbacks' `on_message`: the one-time
GGUF conversion of the model, the tokenizing of demonstrations."""


def new_run_dir(config: TrainConfig) -> Path:
    name = config.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(config.run.output_dir) / name


def run_training(
    config: TrainConfig,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    force: bool = False,
    callbacks: Sequence[Callback] = (),
    console: Console | None = None,
) -> dict[str, Any]:
    """Train per `config` with forking-token GRPO; returns the summary (also written to
    RUN/summary.json). `console`: print as `rldojo train` does (a `ConsoleCallback`).
    With `run.train_ranks` > 1 (and `run.cluster = "ray"`) the ranks are Ray actors
    (`on_ray_ranks`), each running this function as its rank."""
    from rldojo.training.grpo import GrpoObjective

    run_dir = run_dir or new_run_dir(config)
    if config.run.train_ranks > 1 and world_size_from_env() == 1:  # not a rank yet
        return on_ray_ranks(
            config,
            run_dir,
            resume=resume,
            overwrite=overwrite,
            force=force,
            callbacks=callbacks,
            console=console,
        )
    return run_loop(
        lambda d: GrpoObjective(Run(config, run_dir, resume=resume, dist=d)),
        config,
        run_dir,
        command="train",
        resume=resume,
        overwrite=overwrite,
        force=force,
        callbacks=with_console(callbacks, console),
    )


def on_ray_ranks(
    config: TrainConfig,
    run_dir: Path,
    *,
    resume: bool,
    overwrite: bool,
    force: bool,
    callbacks: Sequence[Callback],
    console: Console | None,
) -> dict[str, Any]:
    """`run_training` on `run.train_ranks` Ray actors (`rldojo.cluster.train_ranks`), each
    with a rank's torchrun environment; rank 0's output printed on `console`, its summary
    returned. `callbacks` are sent to the ranks and called on rank 0 (in its process). A
    lost rank is a `RunStopped` naming it (the checkpoints written are kept)."""
    from rldojo.cluster.train_ranks import RankError, run_on_ranks

    kwargs = {
        "config": config,
        "run_dir": run_dir.absolute(),
        "resume": resume,
        "overwrite": overwrite,
        "force": force,
        "callbacks": list(callbacks),
    }
    run = config.run
    try:
        return run_on_ranks(
            run_training,
            kwargs,
            ranks=run.train_ranks,
            gpus=run.train_rank_gpus,
            address=run.ray_address,
            timeout_s=run.dist_timeout_s,
            console=console,
            on_loss=f"; resume with: rldojo train --resume {run_dir}",
        )
    except RankError as exc:
        raise RunStopped(str(exc)) from exc


def with_console(callbacks: Sequence[Callback], console: Console | None) -> list[Callback]:
    """`callbacks`, plus a console callback printing to `console` when one is given."""
    return [*callbacks, *([ConsoleCallback(console)] if console is not None else [])]


@quiet_progress_bars()  # stderr is for warnings and errors, not transformers' bars
def run_loop(
    build: Callable[[Dist], Objective],
    config: TrainConfig,
    run_dir: Path,
    *,
    command: str,
    resume: bool = False,
    overwrite: bool = False,
    force: bool = False,
    callbacks: Sequence[Callback] = (),
) -> dict[str, Any]:
    """Run the objective `build(dist)` makes; returns the summary (also RUN/summary.json).

    A directory that holds a run is refused unless `resume` (then a config that changes
    what its rollouts mean is refused unless `force`) or `overwrite` (the old run is
    moved aside). `build` checks every input before it writes anything. Raises
    `FailureBudgetExceeded` or `RunInterrupted` (`rldojo.training.stops`) after writing the
    summary, when the run stopped for either. Started by torchrun on several ranks, every
    rank runs the loop and rank 0 alone writes the run directory and calls the callbacks
    (`rldojo.training.distributed`)."""
    d = init_dist(config.run.shard, _device(config), config.run.dist_timeout_s)
    try:
        say = CallbackList(callbacks if d.main else ())
        changes = {}
        if d.main:
            changes = _claim(
                config,
                run_dir,
                command=command,
                resume=resume,
                overwrite=overwrite,
                force=force,
                say=say.on_message,
            )
        d.barrier()  # the others build once rank 0 made the directory theirs
        started = time.perf_counter()
        with log_lines(say.on_message, *BUILD_LOGGERS):  # the one-time model conversion, ...
            objective = build(d)
        return _go(objective, d, config, run_dir, resume, changes, callbacks, started)
    finally:
        d.close()


def _go(
    objective: Objective,
    d: Dist,
    config: TrainConfig,
    run_dir: Path,
    resume: bool,
    changes: dict[str, tuple[Any, Any]],
    callbacks: Sequence[Callback],
    started: float,
) -> dict[str, Any]:
    """The loop of a built objective: rank 0 logs, every rank steps."""
    logger = None
    if d.main:
        record_config_change(run_dir, "resume" if resume else "start", changes)
        if resume:  # the steps after the checkpoint are redone, and logged again
            resumed = latest_checkpoint(run_dir / "checkpoints") is not None
            _trim_logs(run_dir, objective.run.step_num if resumed else None)
        logger = MetricsLogger(
            run_dir,
            report_to=config.run.report_to,
            resume_step=objective.run.step_num if resume else None,
            config=config.model_dump(mode="json"),
        )
        for c in callbacks:
            if isinstance(c, ConsoleCallback | LoggingCallback):
                c.step_line, c.summary_keys = objective.step_line, objective.summary_keys
    mine = [MetricsCallback(logger, kind=objective.kind), *callbacks] if logger else []
    calls = CallbackList(mine)
    calls.on_start(
        {
            "command": objective.command,
            "run_dir": run_dir,
            "step": objective.run.step_num,
            "total_steps": objective.total_steps,
            "lines": objective.header(),
        }
    )
    run = _Run(config, objective, calls, started, d)
    with Interrupts(calls.on_message) as interrupts:
        run.interrupts = interrupts
        try:
            return run.go()
        finally:
            if logger is not None:
                logger.close()
            try:
                objective.close()
            finally:
                objective.run.close()


def _device(config: TrainConfig) -> torch.device:
    """Where the ranks compute (`run.device`; "auto": CUDA when torch sees it)."""
    name = config.run.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


class _Run:
    """One invocation of the loop: the objective, its callbacks, the signal handlers."""

    def __init__(
        self,
        config: TrainConfig,
        objective: Objective,
        calls: CallbackList,
        started: float,
        dist: Dist,
    ) -> None:
        self.config, self.objective, self.calls, self.started = config, objective, calls, started
        self.run = objective.run
        self.dist = dist
        self.interrupts: Interrupts

    def go(self) -> dict[str, Any]:
        try:
            stopped = self._run()
            summary = self._finish(stopped)
            if stopped == "interrupted":
                raise self._interrupted_error()
            return summary
        except KeyboardInterrupt:  # a signal during an evaluation, or a second one
            if not self.interrupts.aborted and self.run.step_num > 0:  # its last step is committed
                self._finish("interrupted")
            raise self._interrupted_error(aborted=self.interrupts.aborted) from None
        except FailureBudgetExceeded:
            self._finish("failures")
            raise

    def _evaluate(self, label: str) -> None:
        def progress(turn: int, done: int, total: int) -> None:
            self.calls.on_eval_progress(with_turn(label, turn), done, total)

        with self.interrupts.immediate():
            result = self.run.evaluate(label, progress)
        if result is not None:  # None: another rank evaluated
            save_eval_rows(self.run.run_dir, label, result)
            self.calls.on_eval(label, self.run.step_num, result)

    def _run(self) -> str:
        """Evaluate before, train, evaluate after; which stopped the steps."""
        obj, run = self.objective, self.run
        start = run.step_num
        if start == 0 and (stop := obj.preflight()) is not None:
            raise stop
        if run.evaluates("before") and "before" not in run.evals:
            self._evaluate("before")
        stopped = self._steps()
        # Evaluated before the final checkpoint, which keeps the result: a run resumed
        # from that checkpoint has nothing left to do (and logs nothing twice).
        if (
            stopped != "interrupted"
            and run.evaluates("after")
            and (run.step_num > start or "after" not in run.evals)
        ):
            self._evaluate("after")
        return stopped

    def _steps(self) -> str:
        """Step to `total_steps`, or until `run.max_minutes` is spent, a signal or a
        callback asks to stop; which stopped it ("steps", "max_minutes", "interrupted",
        "callback"). Raises the failure budget's stop after logging the step that spent it."""
        obj, calls, run, state = self.objective, self.calls, self.config.run, self.run
        budget = None if run.max_minutes is None else 60 * run.max_minutes
        started = time.perf_counter()
        with calls.live():
            while state.step_num < obj.total_steps:
                metrics = obj.step()
                state.finish_step()
                calls.on_step_end(state.step_num, metrics)
                for line in obj.after_step(metrics):
                    calls.on_message(line)
                if obj.over_budget is not None:
                    raise obj.over_budget
                spent = budget is not None and time.perf_counter() - started >= budget
                signalled, spent, asked = self._agree(
                    self.interrupts.requested is not None, spent, calls.should_stop()
                )
                if signalled:
                    return "interrupted"
                last = state.step_num >= obj.total_steps or spent or asked  # then "after"
                every = self.config.eval.every
                if every and state.step_num % every == 0 and not last and state.evaluates("every"):
                    self._evaluate(f"step_{state.step_num}")
                every = run.checkpoint_every  # after the step's logs and evaluation
                if every and state.step_num % every == 0 and not last:
                    calls.on_checkpoint(state.save(obj.state_dict()))
                if state.step_num >= obj.total_steps:
                    break
                if spent:
                    calls.on_message(
                        f"run.max_minutes = {run.max_minutes:g} spent: "
                        f"stopping after step {state.step_num}"
                    )
                    return "max_minutes"
                if asked:
                    calls.on_message(
                        f"a callback asked to stop: stopping after step {state.step_num}"
                    )
                    return "callback"
        return "steps"

    def _agree(self, signalled: bool, spent: bool, asked: bool) -> tuple[bool, bool, bool]:
        """One decision for every rank: a signal any rank got; rank 0's clock and
        callbacks (the ranks' clocks differ, the callbacks live on rank 0)."""
        if self.dist.world == 1:
            return signalled, spent, asked
        spent, asked = self.dist.broadcast((spent, asked))
        return self.dist.sum(float(signalled)) > 0, spent, asked

    def _finish(self, stopped: str) -> dict[str, Any]:
        """Checkpoint (unless the failure budget stopped the run: the checkpoints it has
        are kept), write the summary, hand it to the callbacks."""
        obj, run = self.objective, self.run
        if stopped != "failures":
            self.calls.on_checkpoint(run.save(obj.state_dict()))
        summary = {
            "command": obj.command,
            **obj.summary(),
            "steps": run.step_num,
            "accuracy_before": run.evals.get("before", {}).get("accuracy"),
            "accuracy_after": run.evals.get("after", {}).get("accuracy"),
            "evals": run.evals,
            "wall_s": time.perf_counter() - self.started,
            "run_dir": str(run.run_dir),
            "stopped": stopped,
        }
        newest = latest_checkpoint(run.run_dir / "checkpoints")
        summary["checkpoint"] = None if newest is None else str(newest)
        if self.dist.main:
            (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.calls.on_end(summary)
        return summary

    def _interrupted_error(self, *, aborted: bool = False) -> RunInterrupted:
        """The one line of an interrupted run: where it stopped, what was saved, how to go on."""
        obj, run = self.objective, self.run
        newest = latest_checkpoint(run.run_dir / "checkpoints")
        name = newest.name if newest is not None else None
        saved = (
            "nothing saved"
            if name is None
            else (f"last checkpoint {name}" if aborted else f"checkpoint {name}")
        )
        how = "aborted" if aborted else "interrupted"
        message = (
            f"{how} at step {run.step_num}; {saved}; resume with: "
            f"rldojo {obj.command} --resume {run.run_dir}"
        )
        return RunInterrupted(message, step=run.step_num, checkpoint=name)


def _claim(
    config: TrainConfig,
    run_dir: Path,
    *,
    command: str,
    resume: bool,
    overwrite: bool,
    force: bool,
    say: Callable[[str], None],
) -> dict[str, tuple[Any, Any]]:
    """Check (or make) the run directory before anything starts; the config keys a resume
    changes. Raises `RunDirError` (one line) when the directory cannot be used."""
    moved = claim_run_dir(run_dir, command=command, resume=resume, overwrite=overwrite)
    if moved is not None:
        say(f"--overwrite: the run that was in {run_dir} is now in {moved}")
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
        say(f"resume: config changes {said} (config_history.jsonl)")
    return {**meaning, **harmless}


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
