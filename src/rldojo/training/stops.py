"""Why a run stopped before its budget: the exceptions `run_training`, `run_sft` and
`run_distill` raise after they have written what they keep (checkpoint, `summary.json`
with `stopped`), and the exit code each maps to.

    RunStopped              the base: `stopped` (summary.json's value) and `exit_code`
    FailureBudgetExceeded   too many rollouts could not be scored (exit 1, "failures")
    RunInterrupted          SIGINT/SIGTERM honoured at a safe point (exit 130, "interrupted")

The message of each is the one line the user reads (printed on stderr by the command,
after `error: ` unless `error` is False: an interrupt the user asked for is no error). A
stop for failed grades has the first one's traceback as its `__cause__` (`GradeFailure`),
which `rldojo --debug` prints.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USAGE", "FailureBudgetExceeded",
           "GradeFailure", "RunInterrupted", "RunStopped"]  # fmt: skip

EXIT_USAGE = 2
"""Bad input or usage: nothing was started (a config, data file, run directory, flag)."""
EXIT_FAILED = 1
"""The work started and failed (the failure budget, an unexpected error)."""
EXIT_INTERRUPTED = 130
"""Stopped by SIGINT or SIGTERM (128 + SIGINT, as a shell reports it)."""


class RunStopped(Exception):
    """A run that ended early for a reason the user must read; `str(exc)` is one line."""

    stopped = "error"
    exit_code = EXIT_FAILED
    error = True
    """Whether the command prints the line as an error (`error: ` in front)."""


class GradeFailure(Exception):
    """A failed grade as the cause of a stop: its message is the traceback of the exception
    the grader (or the reward function it called) raised, kept as text
    (`rldojo.graders.base.TRACEBACK`), since that may have been in another process or
    before a resume."""


class FailureBudgetExceeded(RunStopped):
    """More than `run.max_failure_rate` of a window's rollouts could not be scored, or the
    grader preflight failed on every sample.

    `counts`: non-ok statuses in the window, by kind (`grade/error`, `rollout/env_error`,
    ...); `total`: rollouts in the window; `steps`: the window's first and last step (0, 0
    for the preflight); `first_error`: the first error message of the most common kind;
    `traceback`: the first traceback of that kind's grades, if any, also the `__cause__`
    (a `GradeFailure`).
    """

    stopped = "failures"
    exit_code = EXIT_FAILED

    def __init__(
        self,
        message: str,
        *,
        counts: Mapping[str, int] | None = None,
        total: int = 0,
        steps: tuple[int, int] = (0, 0),
        first_error: str = "",
        traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.counts = dict(counts or {})
        self.total = total
        self.steps = steps
        self.first_error = first_error
        self.traceback = traceback
        if traceback:
            self.__cause__ = GradeFailure(traceback)


class RunInterrupted(RunStopped):
    """SIGINT or SIGTERM, honoured after the step in flight was committed (or at once
    during an evaluation). `step`: the last finished step; `checkpoint`: the newest
    checkpoint's directory name, or None when there is none."""

    stopped = "interrupted"
    exit_code = EXIT_INTERRUPTED
    error = False

    def __init__(self, message: str, *, step: int = 0, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.checkpoint = checkpoint
