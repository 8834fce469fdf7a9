"""`rldojo service --ray-address`: reinforcement jobs' rollout workers on a Ray cluster.

The unit tests read the config a job's worker would get (the scheduler's own mapping,
no process started) and what the command passes on. The end-to-end test starts a real
Ray head on this machine (`ray start --head --block`, its own process group and temp
dir, stopped by that group alone) and runs a one-step RFT job through the service."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from service.helpers import (
    FAST,
    ROWS,
    STRING_CHECK,
    ServiceProcess,
    create_job,
    upload,
    wait_for,
    wait_status,
)
from typer.testing import CliRunner

from rldojo.config import load_config
from rldojo.service.scheduler import Scheduler
from rldojo.service.settings import ServiceSettings
from rldojo.service.state import ServiceState

pytestmark = pytest.mark.slow  # a service subprocess on Ray


def _job(state: ServiceState, tmp_path: Path, method: dict) -> dict:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    state.add_file({"id": "file-1", "owner": "o", "filename": "train.jsonl", "bytes": 1,
                    "purpose": "fine-tune", "created_at": 0, "path": str(path)})  # fmt: skip
    row = {"id": "ftjob-1", "owner": "o", "model": "tiny-random", "training_file": "file-1",
           "validation_file": None, "suffix": None, "seed": 0, "metadata": {}, "method": method,
           "status": "running", "created_at": 0, "steps": 1,
           "hyperparameters": {"batch_size": 2, "n_epochs": 1, "learning_rate_multiplier": 1.0,
                               "compute_multiplier": 0.5, "reasoning_effort": "low",
                               "eval_interval": 1, "eval_samples": 0, "steps": 1}}  # fmt: skip
    state.add_job(row)
    return state.job(None, "ftjob-1") or row


@pytest.mark.parametrize("kind", ["reinforcement", "supervised"])
def test_the_ray_address_reaches_reinforcement_jobs_only(tmp_path, kind):
    settings = ServiceSettings(data_dir=tmp_path / "data", ray_address="10.0.0.1:6379")
    state = ServiceState(settings.data_dir)
    try:
        method = {"type": kind, kind: {"hyperparameters": {}}}
        if kind == "reinforcement":
            method[kind]["grader"] = STRING_CHECK
        job = _job(state, tmp_path, method)
        _, args = Scheduler(settings, state)._work(job, tmp_path / "run")
        (config_file := tmp_path / "job.toml").write_text(args[0])
        run = load_config(config_file).run
    finally:
        state.close()
    if kind == "reinforcement":
        assert (run.cluster, run.ray_address) == ("ray", "10.0.0.1:6379")
    else:
        assert (run.cluster, run.ray_address) == ("local", None)


def test_the_command_passes_the_ray_address_on(monkeypatch, tmp_path):
    import rldojo.service

    seen = {}
    monkeypatch.setattr(rldojo.service, "serve_forever", lambda s, *a, **k: seen.update(s=s))
    monkeypatch.setenv("RLDOJO_API_KEYS", "sk-x")
    from rldojo.cli import app

    args = ["service", "--data-dir", str(tmp_path), "--ray-address", "ray://head:10001"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen["s"].ray_address == "ray://head:10001"
    assert "--ray-address" in CliRunner().invoke(app, ["service", "--help"]).output


@pytest.fixture
def ray_head():
    """A Ray head of its own (temp dir, process group); yields its address."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray is None:
        pytest.skip("ray is not installed")
    temp = Path(tempfile.mkdtemp(prefix="rdj", dir="/tmp"))  # short: Ray's socket paths
    proc = subprocess.Popen(
        [ray, "start", "--head", "--block", "--port=0", "--num-cpus=1",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )  # fmt: skip
    try:
        address_file = temp / "ray_current_cluster"
        wait_for(lambda: address_file.exists() or proc.poll() is not None, 120, "the Ray head")
        assert proc.poll() is None, "ray start exited"
        wait_for(lambda: address_file.read_text().strip(), 30, "the head's address")
        yield address_file.read_text().strip()
    finally:
        group = proc.pid  # start_new_session: the group is this process's
        os.killpg(group, signal.SIGTERM)  # --block: stops the processes it started
        try:  # a graceful stop can take half a minute after a job: then kill the group
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            proc.wait(timeout=30)
        try:
            wait_for(lambda: not _group_alive(group), 30, "the Ray head's processes to exit")
        finally:
            if _group_alive(group):
                os.killpg(group, signal.SIGKILL)
            shutil.rmtree(temp, ignore_errors=True)


def _group_alive(group: int) -> bool:
    """Whether a process of this process group is alive (zombies are not)."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def test_an_rft_job_runs_its_rollouts_on_a_ray_cluster(tmp_path, ray_head):
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    service = ServiceProcess(tmp_path / "data", "--ray-address", ray_head, env=env)
    try:
        client = service.client()
        file = upload(client, tmp_path, ROWS[:2])
        job = create_job(client, file.id, hyper=FAST)  # 2 rows, batch 2: one step
        done = wait_status(client, job.id, "succeeded", "failed", timeout_s=240)
        assert done.status == "succeeded", done.error
        run_dir = tmp_path / "data" / "jobs" / job.id
        run = load_config(run_dir / "config.toml").run
        assert (run.cluster, run.ray_address) == ("ray", ray_head)
        db = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
        try:
            infos = [json.loads(i) for (i,) in db.execute("SELECT info FROM rollouts")]
        finally:
            db.close()
        assert infos and all("worker_pid" in i for i in infos)  # rolled out by a Ray actor
    finally:
        service.stop()
