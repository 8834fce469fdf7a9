"""How a job ends when its run cannot be trusted, through the real service and client:
a grader that cannot score the model's samples fails the job (`grader_failures`, the
run's own one-line reason), and a job worker's own output lands in the job's log."""

from __future__ import annotations

import json
import os

import pytest
from service.helpers import FAST, ServiceProcess, create_job, upload, wait_status

pytestmark = pytest.mark.slow  # a service subprocess training tiny-random

STRICT = {
    "type": "python",
    "name": "strict",
    "source": (
        "def grade(sample, item):\n"
        "    if sample['output_text'] == item['reference_answer']:\n"
        "        return 1.0\n"
        "    return 1 / 0\n"
    ),
}
"""Scores the reference answer (so creation's preflight passes) and raises
ZeroDivisionError on anything else: on every sample tiny-random writes."""


def test_a_run_that_cannot_score_its_rollouts_fails_the_job(service, tmp_path):
    client = service.client()
    job = create_job(
        client, upload(client, tmp_path).id, grader=STRICT, hyper={**FAST, "n_epochs": 3}
    )
    done = wait_status(client, job.id, "succeeded", "failed")
    assert done.status == "failed" and done.fine_tuned_model is None and done.finished_at
    assert done.error.code == "grader_failures" and done.error.param is None
    assert "ZeroDivisionError" in done.error.message and "\n" not in done.error.message
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert events[0].level == "error" and events[0].message == f"Job failed: {done.error.message}"
    run = service.data_dir / "jobs" / job.id
    assert json.loads((run / "summary.json").read_text())["stopped"] == "failures"
    (check,) = [e for e in events if "signal" in e.data]  # the base model's samples, graded
    assert check.level == "warn" and "the grader failed on every sample" in check.message
    assert check.data["signal"]["errors"] == check.data["signal"]["samples"] == 16


SITECUSTOMIZE = """
import sys
if "rldojo.workers.child" in " ".join(sys.orig_argv):
    print("worker-stderr-mark", file=sys.stderr, flush=True)
"""
"""Imported at start-up by every interpreter with its folder on PYTHONPATH: each worker
process (job workers and the ones they start) writes a line to its stderr."""


def test_a_job_workers_stderr_goes_to_the_jobs_log(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    paths = [str(hooks), os.environ.get("PYTHONPATH", "")]
    svc = ServiceProcess(
        tmp_path / "data", env={"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    )
    try:
        client = svc.client()
        job = create_job(client, upload(client, tmp_path).id)
        assert wait_status(client, job.id, "succeeded", "failed").status == "succeeded"
        log = (svc.data_dir / "jobs" / job.id / "train.log").read_text()
        assert "rldojo train tiny-random" in log  # the run's console
        assert "worker-stderr-mark" in log  # the job worker's own stderr
        assert not any("worker-stderr-mark" in line for line in svc.lines)
    finally:
        svc.stop()


def test_the_command_passes_retention_pause_and_signal_settings_on(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import rldojo.service
    from rldojo.cli import app

    seen = {}
    monkeypatch.setattr(rldojo.service, "serve_forever", lambda s, *a, **k: seen.update(s=s))
    monkeypatch.setenv("RLDOJO_API_KEYS", "sk-x")
    args = ["service", "--data-dir", str(tmp_path), "--keep-checkpoints", "3",
            "--pause-timeout-s", "9.5", "--signal-prompts", "0"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    s = seen["s"]
    assert (s.keep_checkpoints, s.pause_timeout_s, s.signal_prompts) == (3, 9.5, 0)
