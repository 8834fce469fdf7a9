"""`kill -9` of the service mid-job, then a restart on the same data dir: every file and
job is there, the job resumes from its last checkpoint and succeeds, no worker is left."""

from __future__ import annotations

import pytest
from service.helpers import (
    FAST,
    PYTHON,
    ServiceProcess,
    alive,
    create_job,
    upload,
    wait_for,
    wait_status,
    worker_pids,
)

pytestmark = pytest.mark.slow  # a service subprocess, SIGKILLed


def test_kill9_mid_job_then_restart_finishes_the_job(tmp_path):
    data = tmp_path / "data"
    first = ServiceProcess(data)
    try:
        client = first.client()
        file = upload(client, tmp_path)
        job = create_job(client, file.id, grader=PYTHON, hyper={**FAST, "n_epochs": 4})
        wait_for(
            lambda: client.fine_tuning.jobs.checkpoints.list(job.id).data, 120, "a first checkpoint"
        )
        pids = worker_pids(first.proc.pid)
        assert pids and client.fine_tuning.jobs.retrieve(job.id).status == "running"
    finally:
        first.kill9()
    # The worker dies with the service (parent-death signal + its parent check).
    wait_for(lambda: not any(alive(p) for p in pids), 30, "the orphaned worker to exit")

    second = ServiceProcess(data)
    try:
        client = second.client()
        assert client.files.retrieve(file.id).bytes == file.bytes
        assert [j.id for j in client.fine_tuning.jobs.list().data] == [job.id]
        done = wait_status(client, job.id, "succeeded", "failed")
        assert done.status == "succeeded", done.error
        steps = {
            c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id, limit=100).data
        }
        assert steps == {7, 8}  # the newest two are kept (keep_checkpoints)
        events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
        assert any("Service restarted" in e.message for e in events)
        metric_steps = [e.data["step"] for e in events if e.type == "metrics"]
        assert sorted(metric_steps) == list(range(1, 9))  # each step reported once
        log = (data / "jobs" / job.id / "train.log").read_text()
        assert log.count("rldojo train tiny-random") == 2  # started once, resumed once
        wait_for(lambda: not worker_pids(second.proc.pid), 30, "the worker to be reaped")
    finally:
        second.stop()
