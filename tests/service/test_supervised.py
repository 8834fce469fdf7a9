"""Supervised fine-tuning jobs (`method.type = "supervised"`, `rldojo sft`) end to end
through the official openai client, on a real service subprocess with real worker
processes and real `tiny-random` training; their rows checked with line numbers."""

from __future__ import annotations

import contextlib

import openai
import pytest
from service.helpers import (
    SFT_ROWS,
    create_sft_job,
    results,
    upload,
    wait_for,
    wait_status,
    worker_pids,
)

pytestmark = pytest.mark.slow  # a service subprocess training tiny-random


def test_supervised_job_trains_reports_each_step_and_its_model_serves(service, tmp_path):
    client = service.client()
    train = upload(client, tmp_path, SFT_ROWS, "chat.jsonl")
    valid = upload(client, tmp_path, SFT_ROWS[:2], "valid.jsonl")
    job = create_sft_job(
        client, train.id, {"n_epochs": 2, "batch_size": 2}, validation_file=valid.id, suffix="s"
    )
    assert job.method.type == "supervised" and job.status in ("validating_files", "queued")
    done = wait_status(client, job.id, "succeeded", "failed")
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:tiny-random:s:{job.id}"
    resolved = done.method.supervised.hyperparameters
    assert (resolved.n_epochs, resolved.batch_size) == (2, 2)
    assert resolved.learning_rate_multiplier == 1.0  # "auto"
    assert done.hyperparameters.n_epochs == 2 and done.trained_tokens > 0

    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    steps = {e.data["step"]: e for e in events if e.type == "metrics" and "train_loss" in e.data}
    assert sorted(steps) == [1, 2, 3, 4]  # 4 rows / batch 2, two epochs
    assert steps[1].message.startswith("Step 1/4: train loss ")
    said = [e.message for e in reversed(events)]  # oldest first: the phases before step 1
    phases = ["Loading model tiny-random and tokenizing the training file",
              "sft: tokenizing 4 demonstrations from chat.jsonl",  # its name, not where it is
              "Model and data loaded: training 4 steps", "Step 1/4"]  # fmt: skip
    at = [next(i for i, m in enumerate(said) if m.startswith(p)) for p in phases]
    assert at == sorted(at), said
    assert all(e.data["train_loss"] > 0 and e.data["total_steps"] == 4 for e in steps.values())
    (valid_event,) = [e for e in events if "full_valid_loss" in e.data]
    assert valid_event.data["step"] == 4 and valid_event.data["full_valid_loss"] > 0

    (ckpt,) = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert ckpt.step_number == 4
    assert ckpt.fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-4"
    metrics = ckpt.metrics.model_dump()
    assert metrics["train_loss"] > 0 and metrics["full_valid_loss"] > 0

    table = results(client, done)
    assert table[0] == ["step", "train_loss", "train_tokens", "learning_rate",
                        "full_valid_loss", "full_valid_mean_token_accuracy"]  # fmt: skip
    assert [r[0] for r in table[1:]] == ["1", "2", "3", "4"]
    assert all(float(r[1]) > 0 for r in table[1:]) and float(table[4][4]) > 0
    assert table[1][4] == ""  # the validation loss is the last step's

    reply = client.chat.completions.create(
        model=done.fine_tuned_model,
        messages=[{"role": "user", "content": "Say yes."}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.model == done.fine_tuned_model and reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="fine-tune-results"):  # not training data
        create_sft_job(client, done.result_files[0])


def test_broken_supervised_rows_fail_the_job_with_the_line_and_field(service, tmp_path):
    client = service.client()
    user_only = {"messages": [{"role": "user", "content": "hi"}]}
    bad_role = {"messages": [{"role": "bot", "content": "hi"}]}
    weighted = {"messages": [*SFT_ROWS[0]["messages"][:2],
                             {"role": "assistant", "content": "no", "weight": 0}]}  # fmt: skip
    cases = [
        ("noassistant.jsonl", [SFT_ROWS[0], user_only],
         "noassistant.jsonl:2: field 'messages': no assistant turn"),
        ("role.jsonl", [SFT_ROWS[0], SFT_ROWS[1], bad_role],
         "role.jsonl:3: field 'messages[0]'.role: expected one of"),
        ("weight.jsonl", [weighted], "weight.jsonl:1: field 'messages[2]'.weight: 0 is not"),
        ("json.jsonl", [SFT_ROWS[0], '{"messages": [\n'], "json.jsonl:2:"),
    ]  # fmt: skip
    for name, rows, text in cases:
        file = upload(client, tmp_path, rows, name)
        job = wait_status(client, create_sft_job(client, file.id).id, "failed", "succeeded")
        assert job.status == "failed" and text in job.error.message, job.error
        assert "\n" not in job.error.message and job.error.code == "invalid_file"
    good = upload(client, tmp_path, SFT_ROWS, "good.jsonl")
    broken_valid = upload(client, tmp_path, [user_only], "badvalid.jsonl")
    job = create_sft_job(client, good.id, validation_file=broken_valid.id)
    job = wait_status(client, job.id, "failed", "succeeded")
    assert job.status == "failed" and "badvalid.jsonl:1: field 'messages'" in job.error.message


def test_supervised_hyperparameters_are_checked_and_auto_resolved(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path, SFT_ROWS, "chat.jsonl")
    bad = {
        "n_epochs": "three",
        "batch_size": -1,
        "learning_rate_multiplier": True,
        "beta": 0.1,  # DPO's, not supervised's
        "compute_multiplier": 1.0,  # reinforcement's
    }
    for key, value in bad.items():
        with pytest.raises(openai.BadRequestError) as info:
            create_sft_job(client, file.id, {key: value})
        assert info.value.body["param"] == f"method.supervised.hyperparameters.{key}"
    with pytest.raises(openai.BadRequestError, match="integer"):
        create_sft_job(client, file.id, {"n_epochs": 1.5})
    with pytest.raises(openai.BadRequestError, match=r"method\.supervised"):
        client.fine_tuning.jobs.create(
            model="tiny-random",
            training_file=file.id,
            method={"type": "supervised", "supervised": "fast"},
        )
    auto = create_sft_job(client, file.id, {"n_epochs": "auto"})
    queued = wait_status(client, auto.id, "queued", "running", "succeeded", "failed")
    with contextlib.suppress(openai.BadRequestError):  # unless it has finished already
        client.fine_tuning.jobs.cancel(auto.id)
    resolved = queued.method.supervised.hyperparameters
    assert (resolved.n_epochs, resolved.batch_size, resolved.learning_rate_multiplier) == (
        3,
        4,  # min(16, rows)
        1.0,
    )
    legacy = client.fine_tuning.jobs.create(  # no method: OpenAI's default, supervised
        model="tiny-random", training_file=file.id, hyperparameters={"n_epochs": 1}
    )
    assert legacy.method.type == "supervised"
    assert client.fine_tuning.jobs.cancel(legacy.id).status == "cancelled"


def test_a_paused_supervised_job_resumes_from_its_pause_checkpoint(service, tmp_path):
    """A pause checkpoints the step in flight (the run loop's interrupt); resume goes on
    from it, and each step is still reported once (events and results file)."""
    client = service.client()
    file = upload(client, tmp_path, SFT_ROWS, "chat.jsonl")
    job = create_sft_job(client, file.id, {"n_epochs": 30, "batch_size": 1})  # 120 steps
    wait_for(
        lambda: any("train_loss" in e.data for e in client.fine_tuning.jobs.list_events(job.id)),
        120,
        "a first training step",
    )
    assert client.fine_tuning.jobs.pause(job.id).status == "paused"
    assert not worker_pids(service.proc.pid)
    paused = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert len(paused) == 1 and 1 <= paused[0] < 120  # the step the pause stopped after
    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    done = wait_status(client, job.id, "succeeded", "failed", timeout_s=300)
    assert done.status == "succeeded", done.error
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    events += client.fine_tuning.jobs.list_events(job.id, limit=100, after=events[-1].id).data
    assert any(e.message == "Fine-tuning job resumed" for e in events)
    steps = [e.data["step"] for e in events if "train_loss" in e.data]
    assert sorted(steps) == list(range(1, 121))
    checkpoints = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id).data]
    assert sorted(checkpoints) == sorted([paused[0], 120])
    assert [r[0] for r in results(client, done)[1:]] == [str(s) for s in range(1, 121)]
