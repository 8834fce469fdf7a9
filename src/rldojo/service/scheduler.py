"""The job scheduler: validate, queue, run each job in a worker process, watch, finish.

One thread with its own event loop (`Scheduler.start`). Every `poll_s` it

1. validates jobs in `validating_files` (`rldojo.service.rft_env.read_rft_rows`: every
   row, with line numbers; the grader's `{{item.x}}` fields) and resolves the "auto"
   hyperparameters: then `queued`, or `failed` with a one-line reason;
2. starts `queued` jobs, oldest first, while fewer than `max_concurrent_jobs` run: each
   in its own `rldojo.workers.WorkerProcess` (a fresh interpreter in its own process
   group, which dies with the service) calling `rldojo.service.runner.run_job`;
3. turns what running jobs write in their run directories into events (each step's
   reward, evaluations) and checkpoints (`RUN/checkpoints/step_N`).

Cancel and pause change the job's status in SQLite first, then `stop(job_id)` kills its
worker's process group and waits for it to be reaped. At start-up, jobs the previous
service left `running` are queued again; their run directories resume from the newest
checkpoint (`rldojo train --resume`), so a `kill -9` of the service costs at most the
step in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from rldojo.config import dump_config
from rldojo.data.loading import DataError
from rldojo.service.job_spec import resolve_hyperparameters, train_config
from rldojo.service.rft_env import read_rft_rows
from rldojo.service.runner import run_job, trained_tokens
from rldojo.service.settings import ServiceSettings
from rldojo.service.state import ServiceState, new_id
from rldojo.workers import CallError, WorkerDied, WorkerProcess

__all__ = ["Scheduler", "model_name"]

log = logging.getLogger("rldojo.service")


def model_name(job: dict[str, Any]) -> str:
    """`ft:<base>:<suffix>:<job id>` (the suffix may be empty, as on OpenAI)."""
    return f"ft:{job['model']}:{job['suffix'] or ''}:{job['id']}"


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(str(text).split())[:limit]


class Scheduler:
    """Runs the jobs of one `ServiceState` (module docstring)."""

    def __init__(self, settings: ServiceSettings, state: ServiceState) -> None:
        self.settings, self.state = settings, state
        self.jobs_dir = settings.data_dir / "jobs"
        self._workers: dict[str, WorkerProcess] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._seen: dict[str, dict[str, Any]] = {}
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
                self._watch(current)
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
        spec = job["method"]["reinforcement"]["grader"]
        try:
            paths = self._paths(job)
            rows = read_rft_rows(paths["train_path"], paths["name"], spec)
            val_rows = []
            if paths["validation_path"]:
                val_rows = read_rft_rows(paths["validation_path"], paths["validation_name"], spec)
        except (DataError, OSError) as exc:
            self._fail(job["id"], "invalid_file", f"{exc}", ("validating_files",))
            return
        hyper = resolve_hyperparameters(
            job["method"]["reinforcement"]["hyperparameters"], len(rows), len(val_rows)
        )
        if self.state.update_job(
            job["id"],
            hyperparameters=hyper,
            steps=hyper["steps"],
            status="queued",
            only_from=("validating_files",),
        ):
            self.state.add_event(
                job["id"],
                f"Files validated: {len(rows)} training rows, {len(val_rows)} "
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

    def _launch(self, job: dict[str, Any]) -> None:
        job_id = job["id"]
        try:
            cfg = train_config(
                job,
                job["hyperparameters"],
                self._paths(job),
                self.jobs_dir,
                self.settings.job_threads,
            )
        except Exception as exc:  # a stored job that no longer makes a config
            self._fail(job_id, "invalid_config", f"{type(exc).__name__}: {exc}", ("running",))
            return
        run_dir = self.jobs_dir / job_id
        self.state.update_job(job_id, run_dir=str(run_dir), attempts=job["attempts"] + 1)
        resumed = (run_dir / "config.toml").exists()
        self.state.add_event(
            job_id, "Fine-tuning job resumed" if resumed else "Fine-tuning job started"
        )
        worker = WorkerProcess(
            f"job-{job_id}",
            start_timeout_s=self.settings.worker_start_timeout_s,
            die_with_parent=True,  # the scheduler thread lives as long as the service
        )
        with self._lock:
            self._workers[job_id] = worker
        self._tasks[job_id] = asyncio.get_running_loop().create_task(
            self._run(job_id, worker, dump_config(cfg), run_dir)
        )

    async def _run(self, job_id: str, worker: WorkerProcess, toml: str, run_dir: Path) -> None:
        try:
            summary = await worker.call(
                run_job, (toml, str(run_dir)), timeout_s=None, label=f"job {job_id}"
            )
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
                    self._watch(job)
            finally:
                if job is not None:
                    self._succeed(job, summary, run_dir)
        finally:
            await asyncio.to_thread(worker.close, 1.0)
            with self._lock:
                self._workers.pop(job_id, None)
            self._tasks.pop(job_id, None)

    def _succeed(self, job: dict[str, Any], summary: dict[str, Any], run_dir: Path) -> None:
        done = self.state.update_job(
            job["id"],
            status="succeeded",
            fine_tuned_model=model_name(job),
            finished_at=int(time.time()),
            trained_tokens=trained_tokens(run_dir),
            only_from=("running",),
        )
        if done:
            self.state.add_event(
                job["id"],
                f"The job has successfully completed: {model_name(job)}",
                data={"summary": summary},
            )

    # ---------------------------------------------------------------- watching

    def _seen_for(self, job_id: str) -> dict[str, Any]:
        if job_id not in self._seen:
            keys = {
                (e["data"].get("kind"), e["data"].get("step"))
                for e in self.state.events(job_id)
                if e["type"] == "metrics"
            }
            self._seen[job_id] = {"keys": keys, "offset": 0}
        return self._seen[job_id]

    def _watch(self, job: dict[str, Any]) -> None:
        """New metric lines become events, new checkpoint directories checkpoints."""
        if not job.get("run_dir"):
            return
        run_dir = Path(job["run_dir"])
        seen = self._seen_for(job["id"])
        path = run_dir / "metrics.jsonl"
        step_metrics: dict[int, dict[str, Any]] = seen.setdefault("steps", {})
        if path.exists():
            with path.open("rb") as f:
                f.seek(seen["offset"])
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line being written: next time
            seen["offset"] += len(whole)
            for line in whole.decode().splitlines():
                self._metric_event(job, json.loads(line), seen, step_metrics)
        for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):
            if (ckpt / "state.json").exists():
                self._checkpoint(job, ckpt, step_metrics)

    def _metric_event(
        self,
        job: dict[str, Any],
        record: dict[str, Any],
        seen: dict[str, Any],
        step_metrics: dict[int, dict[str, Any]],
    ) -> None:
        kind, step = record.get("kind", "train"), int(record.get("step", 0))
        if kind == "train":
            data = {
                "step": step,
                "train_mean_reward": record.get("reward/mean"),
                "train_pass_rate": record.get("reward/pass_rate"),
                "total_steps": job["steps"],
            }
            message = f"Step {step}/{job['steps']}: mean reward {data['train_mean_reward']}"
        else:
            data = {"step": step, "eval_accuracy": record.get("eval/accuracy")}
            message = f"Evaluation at step {step}: accuracy {data['eval_accuracy']}"
        step_metrics.setdefault(step, {}).update({k: v for k, v in data.items() if k != "step"})
        if (kind, step) in seen["keys"]:
            return
        seen["keys"].add((kind, step))
        self.state.add_event(job["id"], message, kind="metrics", data={"kind": kind, **data})

    def _checkpoint(self, job: dict[str, Any], ckpt: Path, step_metrics: dict[int, Any]) -> None:
        step = int(ckpt.name.split("_")[1])
        name = f"{model_name(job)}:ckpt-step-{step}"
        added = self.state.add_checkpoint(
            {
                "id": new_id("ftckpt"),
                "job_id": job["id"],
                "owner": job["owner"],
                "step": step,
                "metrics": {"step": step, **step_metrics.get(step, {})},
                "path": str(ckpt),
                "model": name,
                "created_at": int(time.time()),
            }
        )
        if added:
            self.state.add_event(
                job["id"],
                f"Checkpoint created at step {step}: {name}",
                data={"step": step, "checkpoint": name},
            )
