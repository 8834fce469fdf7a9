"""Callbacks: what a run tells the world, and how the world may stop it.

The run loop (`rldojo.training.loop`) prints nothing and knows no tracker: everything it has
to say goes to its callbacks, in order. The CLI passes a `ConsoleCallback`; the Python API
(`rldojo.api`) a `LoggingCallback` unless a `ConsoleCallback` is among the user's (what a
run says as records of the standard `logging` module, logger `rldojo.run`: with logging
left unconfigured, Python prints the warnings on stderr and nothing else); the metric log
(`metrics.jsonl` and the `run.report_to` sinks) is a `MetricsCallback` every run has.

A line for `on_message` that starts with `warning: ` (`WARNING_PREFIX`) is a warning,
e.g. a step without learning signal (`rldojo.training.no_signal`); any other is a note.
Third-party progress bars (transformers' "Loading weights", "Writing model shards", the
hub's downloads) are off while a run loads and saves models (`quiet_progress_bars`):
stderr is for warnings and errors. While the steps run, the console prints what the
rollout pipeline logs about its progress (`PROGRESS_LOGGERS`: "still generating ...").

    class StopAt(Callback):
        def __init__(self, reward):
            self.reward, self.best = reward, 0.0
        def on_step_end(self, step, metrics):
            self.best = max(self.best, metrics.get("reward/mean", 0.0))
        def should_stop(self):
            return self.best >= self.reward

    rldojo.train("examples/quickstart.toml", callbacks=[StopAt(0.5)])

A callback that asks to stop ends the run after the step in flight as `run.steps` would:
the final evaluation, a checkpoint, `summary.json` with `stopped` = "callback".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rldojo.report.metrics import MetricsLogger
from rldojo.report.progress import PhaseProgress, log_lines

__all__ = [
    "PROGRESS_LOGGERS",
    "WARNING_PREFIX",
    "Callback",
    "CallbackList",
    "ConsoleCallback",
    "EvalReport",
    "LoggingCallback",
    "MetricsCallback",
    "quiet_progress_bars",
]

WARNING_PREFIX = "warning: "
"""An `on_message` line that starts with this is a warning (`LoggingCallback`: WARNING)."""
PROGRESS_LOGGERS = ("rldojo.pipeline",)
"""Loggers whose records (INFO and up) a `ConsoleCallback` prints while the steps run: the
rollout pipeline's "still generating ..." and "trainer waiting on rollouts ..." lines."""


class EvalReport(Protocol):
    """What `on_eval` receives (`rldojo.eval.harness.EvalResult`)."""

    @property
    def accuracy(self) -> float: ...

    @property
    def n(self) -> int: ...

    def metrics(self) -> dict[str, Any]: ...


class Callback:
    """Override any of these; each default does nothing (`should_stop`: never)."""

    def on_start(self, info: dict[str, Any]) -> None:
        """The run begins: `command`, `run_dir`, `step` (> 0 when resumed), `total_steps`,
        `lines` (what the run says about itself: model, precision, threads, device)."""

    def on_message(self, line: str) -> None:
        """One line for a person: a warning (it starts with `warning: `), a note, what an
        interrupt will do."""

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        """A step is done and committed; `metrics` as `metrics.jsonl` records them."""

    def on_eval_progress(self, label: str, done: int, total: int) -> None:
        """An evaluation is under way: `done` of its `total` episodes have their answer.
        `label` names it ("before", "after", "step_K"; from the second turn of
        multi-turn episodes, with the turn: "before, turn 2")."""

    def on_eval(self, label: str, step: int, result: EvalReport) -> None:
        """A held-out evaluation ("before", "after", "step_K") finished at `step`."""

    def on_checkpoint(self, path: Path) -> None:
        """A checkpoint was written (a directory `RUN/checkpoints/step_NNNNNN`)."""

    def on_end(self, summary: dict[str, Any]) -> None:
        """The run ended; `summary` is what `summary.json` holds (`stopped` says why)."""

    def should_stop(self) -> bool:
        """Asked after each step: True ends the run there (`stopped` = "callback")."""
        return False


class CallbackList(Callback):
    """Calls each callback in order."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks: list[Callback] = list(callbacks)

    def on_start(self, info: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_start(info)

    def on_message(self, line: str) -> None:
        for c in self.callbacks:
            c.on_message(line)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_step_end(step, metrics)

    def on_eval_progress(self, label: str, done: int, total: int) -> None:
        for c in self.callbacks:
            c.on_eval_progress(label, done, total)

    def on_eval(self, label: str, step: int, result: EvalReport) -> None:
        for c in self.callbacks:
            c.on_eval(label, step, result)

    def on_checkpoint(self, path: Path) -> None:
        for c in self.callbacks:
            c.on_checkpoint(path)

    def on_end(self, summary: dict[str, Any]) -> None:
        for c in self.callbacks:
            c.on_end(summary)

    def should_stop(self) -> bool:
        return any([c.should_stop() for c in self.callbacks])  # every one is asked

    @contextmanager
    def live(self) -> Iterator[None]:
        """While the steps run: a console callback's progress bar."""
        with _live_all([c for c in self.callbacks if isinstance(c, ConsoleCallback)]):
            yield


@contextmanager
def _live_all(consoles: Sequence[ConsoleCallback]) -> Iterator[None]:
    if not consoles:
        yield
        return
    with consoles[0].progress(), _live_all(consoles[1:]):
        yield


class MetricsCallback(Callback):
    """`metrics.jsonl` and the trackers: step records (kind `train`, or the objective's
    kind, e.g. `sft`) and evaluation records (kind `eval`)."""

    def __init__(self, logger: MetricsLogger, kind: str = "train") -> None:
        self.logger, self.kind = logger, kind

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.logger.log(step, metrics, kind=self.kind)

    def on_eval(self, label: str, step: int, result: EvalReport) -> None:
        self.logger.log(step, result.metrics(), kind="eval")

    def close(self) -> None:
        self.logger.close()


class ConsoleCallback(Callback):
    """What `rldojo train`, `sft` and `distill` print: the header, a line per step under
    a progress bar, evaluations, and the summary table. `step_line` formats a step's
    metrics (each objective has its own); the default prints its loss."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.total = 0
        self.step_line: Any = None  # set by the loop: the objective's formatter
        self.summary_keys: Sequence[str] = ()
        self._progress: Progress | None = None
        self._bar: Any = None
        self._eval: PhaseProgress | None = None  # the evaluation under way

    def _print(self, line: str, *, markup: bool = True) -> None:
        target = self._progress.console if self._progress is not None else self.console
        target.print(line, soft_wrap=True, markup=markup)

    def on_start(self, info: dict[str, Any]) -> None:
        self.total = int(info.get("total_steps", 0))
        self._start_step = int(info.get("step", 0))
        for line in info.get("lines", ()):
            self._print(line)

    def on_message(self, line: str) -> None:
        self._print(line, markup=False)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        line = self.step_line(step, metrics) if self.step_line else f"step {step}"
        self._print(line, markup=False)
        if self._progress is not None:
            self._progress.update(self._bar, completed=step)

    def on_eval_progress(self, label: str, done: int, total: int) -> None:
        """`evaluating LABEL`: a bar on a terminal, plain lines in a log (`PhaseProgress`)."""
        if self._eval is None:
            self._eval = PhaseProgress(self.console, live=self._progress)
        self._eval.update(f"evaluating {label}", done, total)

    def _end_eval(self) -> None:
        if self._eval is not None:
            self._eval.close()
            self._eval = None

    def on_eval(self, label: str, step: int, result: EvalReport) -> None:
        self._end_eval()
        lo, hi = getattr(result, "ci95", (0.0, 1.0))
        self._print(
            f"held-out accuracy ({label}): [bold]{result.accuracy:.1%}[/] ({result.n} tasks, "
            f"greedy; 95% CI {lo:.1%}-{hi:.1%}); statuses {getattr(result, 'statuses', {})}"
        )

    def on_end(self, summary: dict[str, Any]) -> None:
        from rich.table import Table

        self._end_eval()  # an evaluation an interrupt cut short
        table = Table(title=f"rldojo {summary.get('command', 'train')}: summary", show_header=False)
        for key in self.summary_keys or summary:
            value = summary.get(key)
            if isinstance(value, float):
                value = f"{value:.1%}" if key.startswith("accuracy") else f"{value:.4g}"
            table.add_row(key, str(value))
        self.console.print(table)

    @contextmanager
    def progress(self) -> Iterator[None]:
        columns = (
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with (
            Progress(*columns, console=self.console, transient=False) as progress,
            log_lines(self.on_message, *PROGRESS_LOGGERS),  # with the run's other lines
        ):
            self._progress = progress
            self._bar = progress.add_task(
                "training", total=self.total, completed=getattr(self, "_start_step", 0)
            )
            try:
                yield
            finally:
                self._progress = None


class LoggingCallback(Callback):
    """What a run says, as records of the `rldojo.run` logger (`logging`): the header
    lines, each step's line and each evaluation's result at INFO; `on_message` lines at
    INFO, or at WARNING those that start with `warning: ` (the prefix left out of the
    record), e.g. a step without learning signal. The loop sets `step_line` as it does a
    `ConsoleCallback`'s."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("rldojo.run")
        self.step_line: Callable[[int, dict[str, Any]], str] | None = None
        self.summary_keys: Sequence[str] = ()  # unused: the summary is one line

    def on_start(self, info: dict[str, Any]) -> None:
        from rich.text import Text

        for line in info.get("lines", ()):
            self.logger.info("%s", Text.from_markup(line).plain)

    def on_message(self, line: str) -> None:
        if line.startswith(WARNING_PREFIX):
            self.logger.warning("%s", line.removeprefix(WARNING_PREFIX))
        else:
            self.logger.info("%s", line)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.logger.info("%s", self.step_line(step, metrics) if self.step_line else f"step {step}")

    def on_eval(self, label: str, step: int, result: EvalReport) -> None:
        self.logger.info(
            "held-out accuracy (%s): %.1f%% (%d tasks)", label, 100 * result.accuracy, result.n
        )

    def on_end(self, summary: dict[str, Any]) -> None:
        got = summary.get
        self.logger.info(
            "rldojo %s: stopped %s after step %s; %s",
            got("command"),
            got("stopped"),
            got("steps"),
            got("run_dir"),
        )


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """transformers' and the hub's progress bars ("Loading weights", "Writing model
    shards", downloads) off within the block (also as a decorator), as they were after it:
    they write on stderr, which a run keeps for warnings and errors."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
