"""What a running job writes in its run directory, turned into job events and checkpoints.

`RunWatcher.watch(job)` reads the new complete lines of `RUN/metrics.jsonl` (a line being
written waits for the next look) and the checkpoint directories (`RUN/checkpoints/
step_N` with its `state.json`), and records each once in `ServiceState`:

    kind "train" (rldojo train)  metrics event  "Step N/M: mean reward X"
                                 data: train_mean_reward, train_pass_rate, total_steps
    kind "sft"   (rldojo sft)    metrics event  "Step N/M: train loss X"
                                 data: train_loss, train_tokens, learning_rate, total_steps
    kind "eval"                  metrics event  "Evaluation at step N: accuracy X"
    RUN/validation.json (sft)    metrics event  "Validation at step N: full_valid_loss X"
                                 data: full_valid_loss, full_valid_mean_token_accuracy
    a checkpoint                 a job checkpoint `ft:…:ckpt-step-N` (metrics: that step's
                                 event data) and a message event
    RUN/progress.jsonl           a message event per line (`rldojo.service.runner.JobPhases`:
                                 "Loading model M", "Evaluating before: 64/128 tasks",
                                 the run's messages); data: kind "progress", line

Only the newest `keep` checkpoints stay (`ServiceSettings.keep_checkpoints`): older
directories are deleted, and their job checkpoints with them, once a newer one is
complete; the newest is never touched (a resume reads it; at the end it is the model).

An event is keyed by (kind, step), so a resumed or restarted job, whose run re-logs
steps, reports each step once; a progress line by its line number (the file only grows).
A supervised job's checkpoint is recorded only once its worker has returned
(`final=True`): its metrics then include the validation loss.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from rldojo.service.state import ServiceState, new_id

__all__ = ["PROGRESS", "RunWatcher", "model_name"]

PROGRESS = "progress.jsonl"
"""What a job's worker says it is doing (module docstring), in its run directory."""


def model_name(job: dict[str, Any]) -> str:
    """`ft:<base>:<suffix>:<job id>` (the suffix may be empty, as on OpenAI)."""
    return f"ft:{job['model']}:{job['suffix'] or ''}:{job['id']}"


def _event(record: dict[str, Any], total: int | None) -> tuple[dict[str, Any], str]:
    """(event data, message) of one metrics record."""
    kind, step = record.get("kind", "train"), int(record.get("step", 0))
    if kind == "train":
        data = {
            "step": step,
            "train_mean_reward": record.get("reward/mean"),
            "train_pass_rate": record.get("reward/pass_rate"),
            "total_steps": total,
        }
        return data, f"Step {step}/{total}: mean reward {data['train_mean_reward']}"
    if kind == "sft":
        loss = float(record.get("sft/loss", float("nan")))
        data = {
            "step": step,
            "train_loss": loss,
            "train_tokens": record.get("sft/tokens"),
            "learning_rate": record.get("sft/lr"),
            "total_steps": total,
        }
        return data, f"Step {step}/{total}: train loss {loss:.4f}"
    data = {"step": step, "eval_accuracy": record.get("eval/accuracy")}
    return data, f"Evaluation at step {step}: accuracy {data['eval_accuracy']}"


class RunWatcher:
    """Events and checkpoints from run directories (module docstring)."""

    def __init__(self, state: ServiceState, keep: int = 2) -> None:
        self.state, self.keep = state, max(1, keep)
        self._seen: dict[str, dict[str, Any]] = {}

    def reset(self, job_id: str) -> None:
        """Read the job's run directory from the start next time (a new attempt)."""
        self._seen.pop(job_id, None)

    def _seen_for(self, job_id: str) -> dict[str, Any]:
        if job_id not in self._seen:
            keys = set()
            for e in self.state.events(job_id):
                kind = e["data"].get("kind")
                if e["type"] == "metrics":
                    keys.add((kind, e["data"].get("step")))
                elif kind == "progress":
                    keys.add((kind, e["data"].get("line")))
            self._seen[job_id] = {"keys": keys, "offset": 0, "steps": {}, "progress": (0, 0)}
        return self._seen[job_id]

    def watch(self, job: dict[str, Any], *, final: bool = False) -> None:
        """New metric lines become events, new checkpoint directories checkpoints."""
        if not job.get("run_dir"):
            return
        run_dir = Path(job["run_dir"])
        seen = self._seen_for(job["id"])
        # Phases first: what a look finds of both, the phases mostly announced ("Model and
        # data loaded", "Evaluating before") before the steps and evaluations it finds.
        self._progress(job, run_dir / PROGRESS, seen)
        path = run_dir / "metrics.jsonl"
        if path.exists():
            if path.stat().st_size < seen["offset"]:  # a new file: read it from the start
                seen["offset"] = 0
            with path.open("rb") as f:
                f.seek(seen["offset"])
                chunk = f.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written: next time
            seen["offset"] += len(whole)
            for line in whole.decode().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self._add(job, record.get("kind", "train"), *_event(record, job["steps"]))
        supervised = job["method"]["type"] == "supervised"
        if supervised and not final:
            return
        valid = run_dir / "validation.json"
        if supervised and valid.exists():
            record = json.loads(valid.read_text())
            data: dict[str, Any] = {
                "step": int(record["step"]),
                "full_valid_loss": record["full_valid_loss"],
                "full_valid_mean_token_accuracy": record["full_valid_mean_token_accuracy"],
            }
            message = (
                f"Validation at step {data['step']}: full_valid_loss {data['full_valid_loss']:.4f}"
            )
            self._add(job, "valid", data, message)
        complete = [
            c
            for c in sorted((run_dir / "checkpoints").glob("step_*"))
            if (c / "state.json").exists()
        ]
        for ckpt in complete:
            self._checkpoint(job, ckpt, seen["steps"])
        self._prune(job, complete)

    def _progress(self, job: dict[str, Any], path: Path, seen: dict[str, Any]) -> None:
        """New complete lines of `RUN/progress.jsonl`, each a message event once."""
        offset, line_no = seen["progress"]
        if not path.exists():
            return
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        for line in whole.decode(errors="replace").splitlines():
            line_no += 1
            key = ("progress", line_no)
            try:
                message = str(json.loads(line)["message"])
            except (ValueError, KeyError, TypeError):  # a line a killed worker left unfinished
                continue
            if key not in seen["keys"]:
                seen["keys"].add(key)
                self.state.add_event(job["id"], message, data={"kind": "progress", "line": line_no})
        seen["progress"] = (offset + len(whole), line_no)

    def _prune(self, job: dict[str, Any], complete: list[Path]) -> None:
        """Delete all but the newest `keep` checkpoints (module docstring)."""
        old = complete[: -self.keep]
        for ckpt in old:
            shutil.rmtree(ckpt, ignore_errors=True)
        if old:
            self.state.delete_checkpoints(job["id"], [int(c.name.split("_")[1]) for c in old])

    def _add(self, job: dict[str, Any], kind: str, data: dict[str, Any], message: str) -> None:
        seen = self._seen[job["id"]]
        step = data["step"]
        seen["steps"].setdefault(step, {}).update({k: v for k, v in data.items() if k != "step"})
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
