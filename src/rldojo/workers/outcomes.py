"""What a worker call can end in, how a worker ended, and what a pool counts.

The errors `rldojo.workers.process.WorkerProcess.call` raises (its module docstring says
when), `describe_exit` for messages, and `Counters`, shared by a pool's workers.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from rldojo.workers.child import ErrorInfo


class CallError(Exception):
    """The function raised in the worker. `exc_type`, `message`, `remote_traceback`:
    what and where."""

    def __init__(self, exc_type: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{exc_type}: {message}" if message else exc_type)
        self.exc_type, self.message, self.remote_traceback = exc_type, message, remote_traceback


class CallTimeout(TimeoutError):
    """The call ran past its timeout. `killed`: its worker was killed for it (else the
    call was cancelled inside the worker, or another call's timeout killed the worker)."""

    def __init__(self, message: str, *, killed: bool = False) -> None:
        super().__init__(message)
        self.killed = killed


class WorkerStartTimeout(TimeoutError):
    """The worker did not start serving calls within `start_timeout_s`; it was killed."""


class WorkerDied(RuntimeError):
    """The worker exited before answering. `culprit`: this call's code was running when
    it died, or the cause is unknown (its function probably did it). `how`: how the
    process ended. `init_error`: the initializer's failure, when that ended it. `sent`:
    False when the call never reached the worker (nothing of it ran)."""

    def __init__(
        self,
        message: str,
        *,
        culprit: bool = False,
        how: str = "",
        init_error: ErrorInfo | None = None,
        sent: bool = True,
    ) -> None:
        super().__init__(message)
        self.culprit, self.how, self.init_error, self.sent = culprit, how, init_error, sent


@dataclass
class Counters:
    """What happened to the workers of a pool (shared by its processes)."""

    started: int = 0  # worker processes started (the first ones, then replacements)
    replaced: int = 0  # started in place of a dead worker
    timeouts: int = 0  # calls that ran past their timeout
    killed: int = 0  # workers killed by us (a timeout or a start that took too long)
    died: int = 0  # workers that exited for any reason other than `close`

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words (`exited with code 3`, `killed by SIGSEGV`)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"
