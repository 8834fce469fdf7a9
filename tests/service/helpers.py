"""Helpers of the service tests: a real `rldojo service` in a subprocess, on loopback.

`ServiceProcess(data_dir)` starts ``python -m rldojo.cli service --port 0`` with two API
keys and reads the URL it prints; `kill9()` is the crash the durability test needs.
Waits are bounded polls on a condition (`wait_for`), never sleeps that assume timing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import warm

KEY_A, KEY_B = "sk-test-alice", "sk-test-bob"


def wait_for(condition, timeout_s: float = 120.0, what: str = "condition", every: float = 0.1):
    """Poll `condition()` until it returns something truthy (returned) or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class ServiceProcess:
    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        env = dict(
            os.environ, **(env or {}), RLDOJO_API_KEYS=f"{KEY_A},{KEY_B}", PYTHONUNBUFFERED="1"
        )
        # forked from a warm interpreter (tests/warm.py): the service's imports are done
        self.proc = warm.Popen(
            [
                sys.executable,
                "-m",
                "rldojo.cli",
                "service",
                "--data-dir",
                str(data_dir),
                "--port",
                "0",
                "--job-threads",
                "1",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        found = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                self.lines.append(line)
                if re.search(r"http://127\.0\.0\.1:\d+/v1", line):
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(120):
            self.kill9()
            raise AssertionError("service did not start:\n" + "".join(self.lines))
        url = next(
            m.group(0) for ln in self.lines if (m := re.search(r"http://127\.0\.0\.1:\d+/v1", ln))
        )
        self.url = url

    def client(self, key: str = KEY_A) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()


ROWS = [
    {"messages": [{"role": "user", "content": f"Say {w}."}], "reference_answer": w}
    for w in ("yes", "no", "red", "blue")
]

STRING_CHECK = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}

PYTHON = {
    "type": "python",
    "name": "length",
    "source": "def grade(sample, item):\n    return min(1.0, len(sample['output_text']) / 20)\n",
}

MULTI = {
    "type": "multi",
    "name": "both",
    "calculate_output": "0.5 * exact + 0.5 * sim",
    "graders": {
        "exact": STRING_CHECK,
        "sim": {
            "type": "text_similarity",
            "name": "sim",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "evaluation_metric": "fuzzy_match",
        },
    },
}

FAST = {"batch_size": 2, "n_epochs": 1, "compute_multiplier": 0.5, "reasoning_effort": "low"}

SFT_ROWS = [
    {
        "messages": [
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": f"Say {w}."},
            {"role": "assistant", "content": w},
        ]
    }
    for w in ("yes", "no", "red", "blue")
]
"""OpenAI chat fine-tuning rows (supervised jobs)."""


def upload(client: openai.OpenAI, tmp_path: Path, rows=ROWS, name: str = "train.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" if isinstance(r, dict) else r for r in rows))
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="fine-tune")


def create_job(client, file_id: str, grader=STRING_CHECK, hyper=FAST, **kw):
    return client.fine_tuning.jobs.create(
        model="tiny-random",
        training_file=file_id,
        method={
            "type": "reinforcement",
            "reinforcement": {"grader": grader, "hyperparameters": hyper},
        },
        **kw,
    )


def create_sft_job(client, file_id: str, hyper=None, **kw):
    return client.fine_tuning.jobs.create(
        model="tiny-random",
        training_file=file_id,
        method={"type": "supervised", "supervised": {"hyperparameters": hyper or {}}},
        **kw,
    )


def results(client, job) -> list[list[str]]:
    """The job's results file (`result_files[0]`) as CSV rows, header first."""
    import csv

    (file_id,) = job.result_files
    meta = client.files.retrieve(file_id)
    assert meta.purpose == "fine-tune-results" and meta.filename == "step_metrics.csv"
    return list(csv.reader(client.files.content(file_id).text.splitlines()))


def wait_status(client, job_id: str, *statuses: str, timeout_s: float = 180.0):
    return wait_for(
        lambda: j if (j := client.fine_tuning.jobs.retrieve(job_id)).status in statuses else None,
        timeout_s,
        f"job {job_id} to be {'/'.join(statuses)}",
        every=0.2,
    )


def worker_pids(service_pid: int) -> set[int]:
    """Job worker processes (`rldojo.workers.child`) whose parent is the service."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == service_pid and "rldojo.workers.child" in cmd:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
