"""How a job's worker call ended, recorded on the job: its status, error and events.

`JobOutcomes` is the scheduler's (`rldojo.service.scheduler`) bookkeeping of endings:

    the runner returned          `succeeded`: the model, the results file
                                 (`rldojo.service.results`), trained tokens, and an event
                                 saying how many steps carried learning signal
    FailureBudgetExceeded        `failed`, error code `grader_failures`: too many
                                 rollouts could not be scored (`rldojo.training.stops`); the
                                 message is the exception's line
    RunInterrupted               the SIGTERM of a pause, honoured at a safe point: its
                                 line (the step, the checkpoint saved) as an event; a
                                 job still `running` (someone else signalled the worker)
                                 is `paused`
    any other error              `failed`, `training_error` (`worker_died` when the
                                 worker itself died, `worker_error` when it never ran)

Every status change is conditional on the job still being `running`, so a cancel or
pause that came first wins. The error object is OpenAI's: `code`, `message`, `param`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rldojo.service.results import sft_trained_tokens, signal_steps, write_results_file
from rldojo.service.runner import trained_tokens
from rldojo.service.settings import ServiceSettings
from rldojo.service.state import ServiceState
from rldojo.service.watch import RunWatcher, model_name
from rldojo.workers import CallError

__all__ = ["JobOutcomes", "one_line"]

log = logging.getLogger("rldojo.service")

STOPPED_CODES = {"FailureBudgetExceeded": "grader_failures"}
"""Error codes of the run-stopping exceptions (`rldojo.training.stops`) that fail a job."""


def one_line(text: str, limit: int = 400) -> str:
    return " ".join(str(text).split())[:limit]


class JobOutcomes:
    """Records endings (module docstring) in `state`; `watcher` reads the run once more."""

    def __init__(self, settings: ServiceSettings, state: ServiceState, watcher: RunWatcher):
        self.settings, self.state, self.watcher = settings, state, watcher

    def fail(self, job_id: str, code: str, message: str, only_from: tuple[str, ...]) -> None:
        line = one_line(message)
        error = {"code": code, "message": line, "param": None}
        if self.state.update_job(
            job_id, status="failed", error=error, finished_at=int(time.time()), only_from=only_from
        ):
            self.state.add_event(job_id, f"Job failed: {line}", level="error")

    def _final_watch(self, job_id: str) -> dict[str, Any] | None:
        job = self.state.job(None, job_id)
        if job is not None:
            self.watcher.watch(job, final=True)
        return job

    def call_failed(self, job_id: str, exc: CallError) -> None:
        """The runner raised in the worker: a stop of the run's own, or an error."""
        self._final_watch(job_id)  # the steps and checkpoints written before it ended
        if exc.exc_type == "RunInterrupted":
            self.state.add_event(job_id, one_line(exc.message), data={"stopped": "interrupted"})
            if self.state.update_job(job_id, status="paused", only_from=("running",)):
                self.state.add_event(job_id, "Job paused: its worker was stopped by a signal")
            return
        code = STOPPED_CODES.get(exc.exc_type)
        if code is not None:
            self.fail(job_id, code, exc.message or exc.exc_type, ("running",))
        else:
            self.fail(job_id, "training_error", f"{exc.args[0] if exc.args else exc}", ("running",))

    def succeeded(self, job_id: str, summary: dict[str, Any], run_dir: Path) -> None:
        job = self._final_watch(job_id)
        if job is None or job["status"] != "running":  # cancelled meanwhile
            return
        supervised = job["method"]["type"] == "supervised"
        try:
            results = [write_results_file(self.state, self.settings.data_dir / "files", job)]
        except (OSError, ValueError, KeyError) as exc:  # the model is still good
            log.exception("results file of %s", job["id"])
            self.state.add_event(job["id"], f"No results file: {exc}", level="warn")
            results = []
        done = self.state.update_job(
            job["id"],
            status="succeeded",
            fine_tuned_model=model_name(job),
            finished_at=int(time.time()),
            trained_tokens=sft_trained_tokens(run_dir) if supervised else trained_tokens(run_dir),
            result_files=results,
            steps=int(summary.get("steps") or job["steps"]) if supervised else job["steps"],
            only_from=("running",),
        )
        if not done:
            return
        too_long = (summary.get("left_out") or {}).get("too_long")
        if supervised and too_long:
            self.state.add_event(
                job["id"],
                f"{too_long} training examples longer than sft.max_seq_len tokens were left out",
                level="warn",
            )
        message, data = f"The job has successfully completed: {model_name(job)}", {}
        if not supervised:
            informative, steps = signal_steps(run_dir)
            message += f"; {informative} of {steps} steps carried learning signal"
            data = {"steps_with_signal": informative}
        self.state.add_event(job["id"], message, data={"summary": summary, **data})
