"""Ctrl-C and SIGTERM during a run: stop at the next safe point, or at once when asked twice.

`Interrupts` is a context manager the training commands run under. The first SIGINT or
SIGTERM sets `requested` and prints one line; the loop checks it after each step (the
step in flight is committed: logged, its rollouts in the ledger), saves a checkpoint and
raises `RunInterrupted`. During an evaluation (`with interrupts.immediate():`) the first
signal interrupts at once, since an evaluation keeps nothing a resume needs. A second
signal aborts at once wherever the run is. "At once" is a `KeyboardInterrupt` raised in
the main thread, which the loop turns into `RunInterrupted`.

Handlers are installed only in the main thread (Python delivers signals there); elsewhere
the context manager does nothing, and the default behaviour stays.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

__all__ = ["Interrupts"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """The run's signal handlers; `requested` names the first signal once one came."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.requested: str | None = None
        self.aborted = False  # a second signal: nothing more is saved
        self._immediate = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            self.aborted = True
            raise KeyboardInterrupt(name)
        self.requested = name
        if self._immediate:
            raise KeyboardInterrupt(name)
        self.say(f"{name}: stopping after the step in flight (again to abort at once)")

    @contextmanager
    def immediate(self) -> Iterator[None]:
        """Within this block the first signal interrupts at once (an evaluation)."""
        self._immediate = True
        try:
            yield
        finally:
            self._immediate = False
