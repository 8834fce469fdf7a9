"""A log line when a phase waits too long: what it is waiting on, and for how long.

The line is progress, not a warning (INFO on `rldojo.pipeline`): `rldojo train` prints it
on stdout with the run's other lines (`rldojo.training.callbacks.PROGRESS_LOGGERS`)."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("rldojo.pipeline")

__all__ = ["Watchdog"]


class Watchdog:
    """Logs what a phase is waiting on while it lasts longer than `warn_s` (again every
    `warn_s`): the synchronous source's counterpart of the producer's activity log.
    `set(text)` names the current phase; a daemon thread does the watching."""

    def __init__(self, warn_s: float) -> None:
        self.warn_s = warn_s
        self.activity: str | None = None
        self.since = time.monotonic()
        self.warnings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rldojo-watchdog", daemon=True)
        self._thread.start()

    def set(self, text: str | None) -> None:
        self.activity, self.since = text, time.monotonic()

    def _watch(self) -> None:
        warned_for = (0.0, 0.0)  # (phase start, how long it had lasted at the last warning)
        while not self._stop.wait(min(1.0, self.warn_s / 4)):
            activity, since = self.activity, self.since
            busy = time.monotonic() - since
            last = warned_for[1] if warned_for[0] == since else 0.0
            if activity is not None and busy - last >= self.warn_s:
                log.info("still %s (for %.1fs)", activity, busy)
                self.warnings += 1
                warned_for = (since, busy)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
