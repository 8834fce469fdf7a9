"""The job scheduler: validate, queue, run each job in a worker process, watch, finish.

One thread with its own event loop (`Scheduler.start`). Every `poll_s` it

1. validates jobs in `validating_files` (an event names the files; every row, with line
   numbers: reinforcement rows by `rldojo.service.rft_env.read_rft_rows`, with the
   grader's `{{item.x}}` fields; supervised rows by `rldojo.service.sft_data.read_sft_rows`)
   and resolves the "auto" hyperparameters: then `queued`, or `failed` with a one-line
   reason;
2. starts `queued` jobs, oldest first, while fewer than `max_concurrent_jobs` run: each
   in its own `rldojo.workers.WorkerProcess` (a fresh interpreter in its own process
   group, which dies with the service) calling `rldojo.service.runner.run_job`
   (reinforcement; model graders ask `--judge-base-url`, the key passed as an argument,
   never written to the run's config) or `run_sft_job` (supervised);
3. turns what running jobs write in their run directories into events (each step's
   reward or loss, evaluations) and checkpoints (`rldojo.service.watch`);
4. records how each job's worker call ended (`rldojo.service.outcomes`): succeeded with
   its results file, failed with OpenAI's error object (`grader_failures` when the run
   could not score its rollouts), paused at a checkpoint.

A new reinforcement job's worker first runs the learning-signal check
(`rldojo.service.preflight.signal_check`, bounded by `signal_timeout_s`; a check that
fails or runs out of time is skipped, with an event, and a killed worker is replaced).
A worker's stdout and stderr are appended to its job's `RUN/train.log`.

Cancel and pause change the job's status in SQLite first, then `stop(job_id)`. Cancel
kills the worker's process group and waits for it to be reaped. Pause sends SIGTERM to
the worker alone: the run saves a checkpoint of the step it finished and raises
`RunInterrupted`, whose line becomes an event; `stop` waits for the worker to be gone
(`pause_timeout_s`, then it kills it), so a resumed job continues from the paused step.
At start-up, jobs the previous service left `running` are queued again; their run
directories resume from the newest checkpoint (`rldojo train --resume`, `rldojo sft
--resume`), so a `kill -9` of the service costs at most the steps since it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rldojo.config import dump_config
from rldojo.data.loading import DataError
from rldojo.service.job_spec import (
    resolve_hyperparameters,
    resolve_supervised,
    sft_config,
    train_config,
)
from rldojo.service.judge import checked_spec, judge_table
from rldojo.service.outcomes import JobOutcomes
from rldojo.service.preflight import signal_check, signal_event
from rldojo.service.rft_env import read_rft_rows
from rldojo.service.runner import run_job, run_sft_job
from rldojo.service.settings import ServiceSettings
from rldojo.service.sft_data import read_sft_rows
from rldojo.service.state import ServiceState
from rldojo.service.watch import RunWatcher, model_name
from rldojo.workers import CallError, CallTimeout, WorkerDied, WorkerProcess

__all__ = ["Scheduler", "model_name"]

log = logging.getLogger("rldojo.service")


class Scheduler:
    """Runs the jobs of one `ServiceState` (module docstring)."""

    def __init__(self, settings: ServiceSettings, state: ServiceState) -> None:
        self.settings, self.state = settings, state
        self.jobs_dir = settings.data_dir / "jobs"
        self._workers: dict[str, WorkerProcess] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._done: dict[str, threading.Event] = {}  # set once a job's worker is gone
        self._stopping: set[str] = set()  # jobs whose worker was asked to stop (SIGTERM)
        self.watcher = RunWatcher(state, settings.keep_checkpoints)
        self.outcomes = JobOutcomes(settings, state, self.watcher)
        self._fail = self.outcomes.fail
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        for job in self.state.jobs_in("running"):  # the previous service died under it
            self.state.update_job(job["id"], status="queued", only_from=("running",))
            self.state.add_event(
                job["id"],
                "Service restarted: the job is queued again and resumes from its last checkpoint",
                level="warn",
            )
        self._thread = threading.Thread(target=self._main, name="rldojo-scheduler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for job_id in list(self._workers):
            self.stop(job_id, "service shutting down")

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:  # one bad tick must not stop the scheduler
                log.exception("scheduler tick failed")
            await asyncio.sleep(self.settings.poll_s)
        for task in list(self._tasks.values()):
            task.cancel()

    def stop(self, job_id: str, why: str, *, graceful: bool = False) -> None:
        """Stop the job's worker and wait until it is gone. `graceful` (a pause): SIGTERM,
        so the run checkpoints the step it finished; killed after `pause_timeout_s`.
        Else: kill its whole process group at once."""
        with self._lock:
            worker, done = self._workers.get(job_id), self._done.get(job_id)
        if worker is None:
            return
        timeout = self.settings.pause_timeout_s
        if graceful and done is not None:
            self._terminate(job_id)
            if done.wait(timeout):
                return
            self.state.add_event(
                job_id,
                f"The job's worker did not stop within {timeout:g}s of SIGTERM; killed it "
                "(the job resumes from its newest checkpoint)",
                level="warn",
            )
        worker.kill_and_wait(why)

    def _terminate(self, job_id: str) -> None:
        """SIGTERM the job's worker, once (the API's pause and a tick may both ask)."""
        with self._lock:
            worker = self._workers.get(job_id)
            if worker is None or job_id in self._stopping:
                return
            self._stopping.add(job_id)
        worker.terminate()

    def running(self) -> list[str]:
        with self._lock:
            return list(self._workers)

    # ---------------------------------------------------------------- one tick

    def _tick(self) -> None:
        for job in self.state.jobs_in("validating_files"):
            self._validate(job)
        for job_id in self.running():
            current = self.state.job(None, job_id)
            if current is not None and current["status"] == "paused":  # the API waits on it
                self._terminate(job_id)
            elif current is not None and current["status"] != "running":  # cancelled
                self.stop(job_id, f"job {current['status']}")
            elif current is not None:
                self.watcher.watch(current)
        for job in self.state.jobs_in("queued"):
            if len(self.running()) >= self.settings.max_concurrent_jobs:
                break
            if job["id"] in self.running():  # resumed while its old worker still stops
                continue
            if self.state.update_job(job["id"], status="running", only_from=("queued",)):
                self._launch(self.state.job(None, job["id"]) or job)

    def _paths(self, job: dict[str, Any]) -> dict[str, Any]:
        def stored(file_id: str | None) -> tuple[str | None, str | None]:
            if file_id is None:
                return None, None
            row = self.state.file(job["owner"], file_id)
            if row is None:
                raise DataError(file_id, None, "the file was deleted")
            return row["path"], row["filename"]

        train, name = stored(job["training_file"])
        val, val_name = stored(job["validation_file"])
        return {
            "train_path": train,
            "name": name,
            "validation_path": val,
            "validation_name": val_name,
        }

    def _validate(self, job: dict[str, Any]) -> None:
        method = job["method"]
        also = f" and validation file: {job['validation_file']}" if job["validation_file"] else ""
        self.state.add_event(job["id"], f"Validating training file: {job['training_file']}{also}")
        try:
            paths = self._paths(job)
            train, val = paths["train_path"], paths["validation_path"]
            if method["type"] == "supervised":
                rows = len(read_sft_rows(train, paths["name"]))
                val_rows = len(read_sft_rows(val, paths["validation_name"])) if val else 0
                hyper = resolve_supervised(method["supervised"]["hyperparameters"], rows)
            else:
                spec = method["reinforcement"]["grader"]
                rows = len(read_rft_rows(train, paths["name"], spec))
                val_rows = len(read_rft_rows(val, paths["validation_name"], spec)) if val else 0
                hyper = resolve_hyperparameters(
                    method["reinforcement"]["hyperparameters"], rows, val_rows
                )
        except (DataError, OSError) as exc:
            self._fail(job["id"], "invalid_file", f"{exc}", ("validating_files",))
            return
        if self.state.update_job(
            job["id"],
            hyperparameters=hyper,
            steps=hyper["steps"],
            status="queued",
            only_from=("validating_files",),
        ):
            self.state.add_event(
                job["id"],
                f"Files validated: {rows} training rows, {val_rows} "
                f"validation rows; {hyper['steps']} steps",
                data={"hyperparameters": hyper},
            )

    # ---------------------------------------------------------------- running

    def _work(self, job: dict[str, Any], run_dir: Path) -> tuple[Callable[..., Any], tuple]:
        """What the job's worker calls: the runner function and its arguments."""
        paths, hyper, threads = self._paths(job), job["hyperparameters"], self.settings.job_threads
        if job["method"]["type"] == "supervised":
            cfg = sft_config(job, hyper, paths["train_path"], self.jobs_dir, threads)
            val = paths["validation_path"]
            validation = (val, paths["validation_name"]) if val else None
            return run_sft_job, (dump_config(cfg), str(run_dir), paths["name"], validation)
        # still accepted by this service (it may have restarted with other options)
        checked_spec(job["method"]["reinforcement"]["grader"], self.settings, "grader")
        judge = judge_table(self.settings, with_key=False)  # the key goes as an argument
        cfg = train_config(
            job, hyper, paths, self.jobs_dir, threads, self.settings.ray_address, judge
        )
        return run_job, (dump_config(cfg), str(run_dir), self.settings.judge_api_key)

    def _launch(self, job: dict[str, Any]) -> None:
        job_id = job["id"]
        run_dir = self.jobs_dir / job_id
        try:
            fn, args = self._work(job, run_dir)
        except Exception as exc:  # a stored job that no longer makes a config
            self._fail(job_id, "invalid_config", f"{type(exc).__name__}: {exc}", ("running",))
            return
        self.state.update_job(job_id, run_dir=str(run_dir), attempts=job["attempts"] + 1)
        check = None
        if not (run_dir / "config.toml").exists():
            started = "Fine-tuning job started"
            if fn is run_job and self.settings.signal_prompts > 0:
                s = self.settings
                check = (args[0], args[2], s.signal_prompts, s.signal_samples, s.signal_max_tokens)
        else:
            started = "Fine-tuning job resumed"
        self.watcher.reset(job_id)
        self.state.add_event(job_id, started)
        run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._stopping.discard(job_id)
            self._done[job_id] = threading.Event()
        worker = self._new_worker(job_id, run_dir)
        self._tasks[job_id] = asyncio.get_running_loop().create_task(
            self._run(job_id, worker, fn, args, run_dir, check)
        )

    def _new_worker(self, job_id: str, run_dir: Path) -> WorkerProcess:
        """A worker for the job, its output appended to the job's `train.log`."""
        worker = WorkerProcess(
            f"job-{job_id}",
            start_timeout_s=self.settings.worker_start_timeout_s,
            die_with_parent=True,  # the scheduler thread lives as long as the service
            output=run_dir / "train.log",
        )
        with self._lock:
            self._workers[job_id] = worker
        return worker

    async def _check_signal(
        self, job_id: str, worker: WorkerProcess, args: tuple, run_dir: Path
    ) -> WorkerProcess | None:
        """The learning-signal check on the job's worker; returns the worker to train on
        (a new one when the check's was killed), None when the job stopped meanwhile."""
        self.state.add_event(
            job_id,
            f"Checking the learning signal: {args[2]} prompts x "
            f"{args[3]} samples on the base model",
        )
        try:
            result = await worker.call(
                signal_check,
                args,
                timeout_s=self.settings.signal_timeout_s,
                label="the learning-signal check",
            )
        except (CallError, CallTimeout, WorkerDied) as exc:
            message, level, data = f"Learning-signal check skipped: {exc}", "warn", {}
        else:
            (message, level), data = signal_event(result), {"signal": result}
        current = self.state.job(None, job_id)
        if current is None or current["status"] != "running":
            return None
        self.state.add_event(job_id, message, level=level, data=data)
        if worker.is_alive():
            return worker
        await asyncio.to_thread(worker.close, 1.0)
        return self._new_worker(job_id, run_dir)

    async def _run(
        self,
        job_id: str,
        worker: WorkerProcess,
        fn: Callable[..., Any],
        args: tuple,
        run_dir: Path,
        check: tuple | None,
    ) -> None:
        try:
            if check is not None:
                checked = await self._check_signal(job_id, worker, check, run_dir)
                if checked is None:
                    return
                worker = checked
            summary = await worker.call(fn, args, timeout_s=None, label=f"job {job_id}")
        except CallError as exc:  # the run raised: a stop of its own (outcomes), or an error
            self.outcomes.call_failed(job_id, exc)
        except WorkerDied as exc:  # killed by cancel/pause (status changed), or a crash
            self._fail(job_id, "worker_died", f"the job's worker died: {exc}", ("running",))
        except Exception as exc:  # the worker did not start, or the call failed to send
            self._fail(job_id, "worker_error", f"{type(exc).__name__}: {exc}", ("running",))
        else:
            self.outcomes.succeeded(job_id, summary, run_dir)
        finally:
            with self._lock:
                worker = self._workers.get(job_id, worker)
            await asyncio.to_thread(worker.close, 1.0)
            with self._lock:
                self._workers.pop(job_id, None)
                self._stopping.discard(job_id)
                done = self._done.pop(job_id, None)
            self._tasks.pop(job_id, None)
            if done is not None:
                done.set()
