"""Reinforcement fine-tuning jobs end to end through the official openai client, on a
real service subprocess with real worker processes and real `tiny-random` training."""

from __future__ import annotations

import json
import re

import openai
import pytest
from service.helpers import (
    FAST,
    KEY_B,
    MULTI,
    PYTHON,
    ROWS,
    STRING_CHECK,
    alive,
    create_job,
    results,
    upload,
    wait_for,
    wait_status,
    worker_pids,
)

pytestmark = pytest.mark.slow  # a service subprocess training tiny-random


@pytest.mark.parametrize(
    "grader", [PYTHON, STRING_CHECK, MULTI], ids=["python", "string_check", "multi"]
)
def test_rft_job_succeeds_and_its_model_serves(service, tmp_path, grader):
    client = service.client()
    file = upload(client, tmp_path)
    assert file.id.startswith("file-") and file.object == "file" and file.bytes > 0
    job = create_job(client, file.id, grader=grader, suffix="t1", seed=3, metadata={"team": "a"})
    assert job.id.startswith("ftjob-") and job.object == "fine_tuning.job"
    assert job.status in ("validating_files", "queued")
    done = wait_status(client, job.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:tiny-random:t1:{job.id}"
    assert done.hyperparameters.batch_size == 2 and done.hyperparameters.n_epochs == 1
    resolved = done.method.reinforcement.hyperparameters
    assert resolved.learning_rate_multiplier == 1.0 and resolved.eval_interval == 1  # "auto"
    assert done.metadata == {"team": "a"} and done.seed == 3 and done.finished_at

    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    steps = [e.data["step"] for e in events if e.type == "metrics"]
    assert sorted(steps) == [1, 2]  # 4 rows / batch 2, one epoch
    assert all(e.object == "fine_tuning.job.event" for e in events)
    assert "successfully completed" in events[0].message  # newest first
    page = client.fine_tuning.jobs.list_events(job.id, limit=2)
    rest = client.fine_tuning.jobs.list_events(job.id, limit=100, after=page.data[-1].id)
    assert [e.id for e in page.data + rest.data] == [e.id for e in events]

    ckpts = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in ckpts] == [2, 1]
    assert ckpts[1].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-1"
    assert "train_mean_reward" in ckpts[0].metrics.model_dump()

    table = results(client, done)  # step_metrics.csv, one row per step
    assert table[0] == ["step", "train_reward", "train_reward_std", "train_pass_rate",
                        "valid_reward", "valid_accuracy", "train_groups_informative"]  # fmt: skip
    assert [r[0] for r in table[1:]] == ["1", "2"] and all(r[1] != "" for r in table[1:])
    assert all(r[4] == r[5] == "" for r in table[1:])  # no validation file
    informative = sum(int(r[6]) > 0 for r in table[1:])  # steps whose groups taught
    assert f"; {informative} of 2 steps carried learning signal" in events[0].message
    assert events[0].data["steps_with_signal"] == informative

    (check,) = [e for e in events if "signal" in e.data]  # before step 1, on the base model
    assert check.message.startswith("Learning-signal check: the base model passes ")
    signal = check.data["signal"]
    assert signal["samples"] == 16 and signal["groups"] == 4  # 4 prompts x 4 samples
    assert 0 <= signal["passed"] <= 16 and 0 <= signal["groups_with_variance"] <= 4
    assert (check.level == "warn") == (signal["groups_with_variance"] * 4 < 4)

    models = {m.id for m in client.models.list().data}
    assert {"tiny-random", done.fine_tuned_model, ckpts[1].fine_tuned_model_checkpoint} <= models
    if grader is PYTHON:  # serve the model and a checkpoint (once: loading costs time)
        reply = client.chat.completions.create(
            model=done.fine_tuned_model,
            messages=[{"role": "user", "content": "Say yes."}],
            max_tokens=4,
            temperature=0,
        )
        assert reply.model == done.fine_tuned_model and reply.choices[0].message.content
        text = client.completions.create(
            model=ckpts[1].fine_tuned_model_checkpoint, prompt="Hello", max_tokens=3, temperature=0
        )
        assert text.object == "text_completion" and text.usage.completion_tokens >= 1
        other = service.client(KEY_B)  # another key sees none of it
        assert {m.id for m in other.models.list().data} == {"tiny-random", "smollm2-135m-instruct"}
        with pytest.raises(openai.NotFoundError):
            other.chat.completions.create(
                model=done.fine_tuned_model, messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.NotFoundError):
            other.models.retrieve(done.fine_tuned_model)


def test_rft_validation_file_is_evaluated_every_interval(service, tmp_path):
    client = service.client()
    train = upload(client, tmp_path)
    valid = upload(client, tmp_path, ROWS[:2], "valid.jsonl")
    job = create_job(client, train.id, validation_file=valid.id)
    done = wait_status(client, job.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.validation_file == valid.id
    assert done.method.reinforcement.hyperparameters.eval_samples == 2  # auto: every row
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    evals = [e for e in events if e.type == "metrics" and "eval_accuracy" in e.data]
    assert {e.data["step"] for e in evals} >= {0, 1, 2}  # before training, then each step
    # each phase a user waits through is an event when it starts, in order
    said = [e.message for e in reversed(events)]  # oldest first
    phases = [f"Validating training file: {train.id} and validation file: {valid.id}",
              "Checking the learning signal: 4 prompts x 4 samples", "Loading model tiny-random",
              "Model and data loaded: training 2 steps", "Evaluating before: 0/2 tasks",
              "Evaluation at step 0"]  # fmt: skip
    at = [next(i for i, m in enumerate(said) if m.startswith(p)) for p in phases]
    assert at == sorted(at), said
    assert all(0.0 <= e.data["eval_accuracy"] <= 1.0 for e in evals)
    table = results(client, done)
    by_step = {r[0]: r for r in table[1:]}
    assert set(by_step) == {"0", "1", "2"}
    assert all(by_step[s][5] != "" for s in by_step)  # valid_accuracy at every step
    assert by_step["0"][1] == ""  # step 0 is the evaluation before training


def test_cancel_stops_the_worker_and_leaves_no_process(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path)
    job = create_job(client, file.id, grader=PYTHON, hyper={**FAST, "n_epochs": 500})
    wait_status(client, job.id, "running")
    pids = wait_for(lambda: worker_pids(service.proc.pid), 60, "the job's worker process")
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    wait_for(lambda: not any(alive(p) for p in pids), 10, "the worker to be gone")
    assert client.fine_tuning.jobs.retrieve(job.id).status == "cancelled"
    assert not worker_pids(service.proc.pid)
    again = client.fine_tuning.jobs.retrieve(job.id)
    assert again.fine_tuned_model is None and again.finished_at


def test_pause_checkpoints_the_step_it_stopped_at_and_resume_goes_on_from_it(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path)
    hyper = {**FAST, "n_epochs": 10, "eval_interval": 1000}  # no periodic checkpoint: 20 steps
    job = create_job(client, file.id, grader=PYTHON, hyper=hyper)
    wait_for(
        lambda: any(e.type == "metrics" for e in client.fine_tuning.jobs.list_events(job.id).data),
        120,
        "a first step",
    )
    paused = client.fine_tuning.jobs.pause(job.id)  # returns once the worker is gone
    assert paused.status == "paused"
    assert not worker_pids(service.proc.pid)
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    (line,) = [m for m in messages if m.startswith("interrupted at step ")]
    step = int(re.match(r"interrupted at step (\d+); checkpoint step_(\d+)", line).group(1))
    assert 1 <= step < 20 and f"checkpoint step_{step:06d}" in line
    run = service.data_dir / "jobs" / job.id
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == [f"step_{step:06d}"]
    at_pause = (run / "metrics.jsonl").read_text()
    assert [json.loads(ln)["step"] for ln in at_pause.splitlines()] == list(range(1, step + 1))
    listed = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in listed] == [step]

    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    done = wait_status(client, job.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    after = (run / "metrics.jsonl").read_text()
    assert after.startswith(at_pause)  # the steps before the pause were not redone
    assert [json.loads(ln)["step"] for ln in after.splitlines()] == list(range(1, 21))
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100).data]
    assert "Job paused" in messages and "Fine-tuning job resumed" in messages


def test_only_the_newest_checkpoints_are_kept(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path)
    job = create_job(client, file.id, hyper={**FAST, "n_epochs": 3})  # 6 steps, one ckpt each
    done = wait_status(client, job.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    kept = sorted(p.name for p in (service.data_dir / "jobs" / job.id / "checkpoints").iterdir())
    assert kept == ["step_000005", "step_000006"]  # keep_checkpoints = 2; 6 is the model
    listed = client.fine_tuning.jobs.checkpoints.list(job.id, limit=100).data
    assert [c.step_number for c in listed] == [6, 5]
    models = {m.id for m in client.models.list().data}
    assert f"{done.fine_tuned_model}:ckpt-step-5" in models
    assert f"{done.fine_tuned_model}:ckpt-step-4" not in models
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    created = [e.data["step"] for e in events if e.message.startswith("Checkpoint created")]
    assert sorted(created) == [1, 2, 3, 4, 5, 6]  # each was announced when written


def test_jobs_list_is_paginated_newest_first(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path)
    ids = [create_job(client, file.id).id for _ in range(3)]
    for job_id in ids:
        client.fine_tuning.jobs.cancel(job_id)
    first = client.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in first.data] == ids[::-1][:2] and first.has_more
    second = client.fine_tuning.jobs.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == ids[0]
    assert all(j.status == "cancelled" for j in first.data)
