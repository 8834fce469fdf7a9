"""The job scheduler: validate, queue, run each job in a worker process, watch, finish.

One thread with its own event loop (`Scheduler.start`). Every `poll_s` it

1. validates jobs in `validating_files` (every row, with line numbers: reinforcement
   rows by `rldojo.service.rft_env.read_rft_rows`, with the grader's `{{item.x}}`
   fields; supervised rows by `rldojo.service.sft_data.read_sft_rows`) and resolves the
   "auto" hyperparameters: then `queued`, or `failed` with a one-line reason;
2. starts `queued` jobs, oldest first, while fewer than `max_concurrent_jobs` run: each
   in its own `rldojo.workers.WorkerProcess` (a fresh interpreter in its own process
   group, which dies with the service) calling `rldojo.service.runner.run_job`
   (reinforcement; model graders ask `--judge-base-url`, the key passed as an argument,
   never written to the run's config) or `run_sft_job` (supervised);
3. turns what running jobs write in their run directories into events (each step's
   reward or loss, evaluations) and checkpoints (`rldojo.service.watch`);
4. on success, stores the results CSV as a file listed in the job's `result_files`
   (`rldojo.service.results`).

Cancel and pause change the job's status in SQLite first, then `stop(job_id)` kills its
worker's process group and waits for it to be reaped. At start-up, jobs the previous
service left `running` are queued again; their run directories resume from the newest
checkpoint (`rldojo train --resume`), so a `kill -9` of the service costs at most the
step in flight; a supervised job, which checkpoints only at its end, starts over.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
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
from rldojo.service.results import sft_trained_tokens, write_results_file
from rldojo.service.rft_env import read_rft_rows
from rldojo.service.runner import clear_sft_run, run_job, run_sft_job, trained_tokens
from rldojo.service.settings import ServiceSettings
from rldojo.service.sft_data import read_sft_rows
from rldojo.service.state import ServiceState
from rldojo.service.watch import RunWatcher, model_name
from rldojo.workers import CallError, WorkerDied, WorkerProcess

__all__ = ["Scheduler", "model_name"]

log = logging.getLogger("rldojo.service")


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(str(text).split())[:limit]


class Scheduler:
    """Runs the jobs of one `ServiceState` (module docstring)."""

    def __init__(self, settings: ServiceSettings, state: ServiceState) -> None:
        self.settings, self.state = settings, state
        self.jobs_dir = settings.data_dir / "jobs"
        self._workers: dict[str, WorkerProcess] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.watcher = RunWatcher(state)
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

    def stop(self, job_id: str, why: str) -> None:
        """Kill the job's worker (its whole process group) and wait until it is reaped."""
        with self._lock:
            worker = self._workers.get(job_id)
        if worker is not None:
            worker.kill_and_wait(why)

    def running(self) -> list[str]:
        with self._lock:
            return list(self._workers)

    # ---------------------------------------------------------------- one tick

    def _tick(self) -> None:
        for job in self.state.jobs_in("validating_files"):
            self._validate(job)
        for job_id in self.running():
            current = self.state.job(None, job_id)
            if current is not None and current["status"] != "running":  # paused, cancelled
                self.stop(job_id, f"job {current['status']}")
            elif current is not None:
                self.watcher.watch(current)
        for job in self.state.jobs_in("queued"):
            if len(self.running()) >= self.settings.max_concurrent_jobs:
                break
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

    def _fail(self, job_id: str, code: str, message: str, only_from: tuple[str, ...]) -> None:
        line = _one_line(message)
        error = {"code": code, "message": line, "param": None}
        if self.state.update_job(
            job_id, status="failed", error=error, finished_at=int(time.time()), only_from=only_from
        ):
            self.state.add_event(job_id, f"Job failed: {line}", level="error")

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
        if not (run_dir / "config.toml").exists():
            started = "Fine-tuning job started"
        elif job["method"]["type"] == "supervised":
            clear_sft_run(run_dir)  # before the watcher reads the run directory again
            started = "Fine-tuning job restarted from its first step (supervised jobs save "
            started += "their checkpoint at the end)"
        else:
            started = "Fine-tuning job resumed"
        self.watcher.reset(job_id)
        self.state.add_event(job_id, started)
        worker = WorkerProcess(
            f"job-{job_id}",
            start_timeout_s=self.settings.worker_start_timeout_s,
            die_with_parent=True,  # the scheduler thread lives as long as the service
        )
        with self._lock:
            self._workers[job_id] = worker
        self._tasks[job_id] = asyncio.get_running_loop().create_task(
            self._run(job_id, worker, fn, args, run_dir)
        )

    async def _run(
        self,
        job_id: str,
        worker: WorkerProcess,
        fn: Callable[..., Any],
        args: tuple,
        run_dir: Path,
    ) -> None:
        try:
            summary = await worker.call(fn, args, timeout_s=None, label=f"job {job_id}")
        except CallError as exc:
            self._fail(
                job_id, "training_error", f"{exc.args[0] if exc.args else exc}", ("running",)
            )
        except WorkerDied as exc:  # killed by cancel/pause (status changed), or a crash
            self._fail(job_id, "worker_died", f"the job's worker died: {exc}", ("running",))
        except Exception as exc:  # the worker did not start, or the call failed to send
            self._fail(job_id, "worker_error", f"{type(exc).__name__}: {exc}", ("running",))
        else:
            job = self.state.job(None, job_id)
            try:
                if job is not None:
                    self.watcher.watch(job, final=True)
            finally:
                if job is not None:
                    self._succeed(job, summary, run_dir)
        finally:
            await asyncio.to_thread(worker.close, 1.0)
            with self._lock:
                self._workers.pop(job_id, None)
            self._tasks.pop(job_id, None)

    def _succeed(self, job: dict[str, Any], summary: dict[str, Any], run_dir: Path) -> None:
        supervised = job["method"]["type"] == "supervised"
        current = self.state.job(None, job["id"])
        if current is None or current["status"] != "running":  # cancelled meanwhile
            return
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
        self.state.add_event(
            job["id"],
            f"The job has successfully completed: {model_name(job)}",
            data={"summary": summary},
        )
