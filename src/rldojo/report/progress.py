"""Progress of a long phase for a person: a rich bar on a terminal, plain lines elsewhere.

What a user waits through (a held-out evaluation, `rldojo eval`) shows how far it got.
On an interactive console it is a rich progress bar: a row of a `Progress` already on
screen (the training bar of `rldojo.training.callbacks.ConsoleCallback`), or a bar of its
own that disappears when the phase ends. On any other console (a log file, a pipe, CI)
it is a plain line "LABEL: DONE/TOTAL" when the phase starts, at each eighth of the way
and at the end: a log shows progress without a line per item.

`log_lines(say, *loggers)` hands what those loggers record (INFO and up) to `say` while it
is open: how a layer below the console reaches it (the one-time GGUF conversion of
`rldojo.policy.models`, the tokenizing of `rldojo.training.sft`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["PLAIN_PARTS", "PhaseProgress", "bar_columns", "log_lines", "plain_due", "with_turn"]

PLAIN_PARTS = 8
"""A plain console gets a line at each 1/PLAIN_PARTS of a phase (and at its start and end)."""


def plain_due(done: int, total: int, said: int | None, parts: int = PLAIN_PARTS) -> bool:
    """Whether a plain line is due at `done` of `total`, `said` being the count the last
    line showed (None: no line yet): the first line, one per `1/parts` passed, the end."""
    if said is None:
        return True
    if done >= total:
        return said < total
    step = -(-total // parts)  # ceil: at most `parts` lines before the end
    return done // step > said // step


class PhaseProgress:
    """Phases' progress on `console` (module docstring), one at a time: an `update` with
    another label ends the phase before. `live`: a `Progress` on screen to add a row to;
    else, on an interactive console, a bar of its own until the phase ends."""

    def __init__(self, console: Console, *, live: Progress | None = None) -> None:
        self.console, self.live = console, live
        self.label: str | None = None
        self._own: Progress | None = None
        self._task: TaskID | None = None
        self._said: int | None = None

    def update(self, label: str, done: int, total: int) -> None:
        """`done` of `total` items (episodes, samples) of the phase `label` are through."""
        if label != self.label:
            self.close()
            self.label = label
        if not (self.console.is_interactive or self.console.is_jupyter):
            if plain_due(done, total, self._said):
                self._said = done
                self.console.print(
                    f"{label}: {done}/{total}", soft_wrap=True, markup=False, highlight=False
                )
            return
        bar = self.live or self._own
        if bar is None:
            bar = self._own = Progress(*bar_columns(), console=self.console, transient=True)
            bar.start()
        if self._task is None:
            self._task = bar.add_task(label, total=total)
        bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        """The phase ended (or failed): its bar goes away; plain lines stay."""
        if self._own is not None:
            self._own.stop()
        elif self.live is not None and self._task is not None:
            self.live.remove_task(self._task)
        self._own, self._task, self._said, self.label = None, None, None, None


def with_turn(label: str, turn: int) -> str:
    """A phase's label for turn `turn` of multi-turn episodes: "before", "before, turn 2"."""
    return label if turn == 1 else f"{label}, turn {turn}"


def bar_columns() -> tuple[TextColumn | BarColumn | TimeElapsedColumn | TimeRemainingColumn, ...]:
    """The columns of every rldojo progress bar: what, the bar, done/total, elapsed, left."""
    return (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )


class _Say(logging.Handler):
    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.say(record.getMessage())
        except Exception:  # a console that fails must not fail the work it reports on
            self.handleError(record)


@contextmanager
def log_lines(say: Callable[[str], None], *loggers: str) -> Iterator[None]:
    """While open, each INFO-or-higher record of `loggers` (names) is a line for `say`."""
    handler = _Say(say)
    watched = [logging.getLogger(name) for name in loggers]
    levels = [log.level for log in watched]
    for log in watched:
        log.addHandler(handler)
        if log.getEffectiveLevel() > logging.INFO:  # the default is WARNING
            log.setLevel(logging.INFO)
    try:
        yield
    finally:
        for log, level in zip(watched, levels, strict=True):
            log.removeHandler(handler)
            log.setLevel(level)
