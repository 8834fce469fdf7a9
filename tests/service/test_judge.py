"""Model graders through `rldojo service --judge-base-url`: graders/run and an RFT job
answered by a deterministic judge stand-in served over HTTP on loopback (official openai
client, real service subprocess, real worker and `tiny-random` training); without the
option a model grader is a 400 naming it; the judge's API key reaches the judge and is
written nowhere (job objects, events, the data directory, the service's output)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from judge_standin import StandinJudge
from service.helpers import ROWS, STRING_CHECK, ServiceProcess, create_job, upload, wait_status

from rldojo.inference import ScriptedEngine
from rldojo.inference.app import build_app
from rldojo.inference.server import start_in_thread

pytestmark = pytest.mark.slow  # a service subprocess training tiny-random

JUDGE_KEY = "sk-judge-7f3a9c-never-written"
JUDGE_MODEL = "judge-model"


def score_model(prompt: str = "Rate the answer.", model: str = JUDGE_MODEL, **extra: Any) -> dict:
    """A score_model grader; the stand-in scores the share of the prompt's quoted
    keywords in the sample (no keywords: the middle of the range)."""
    return {
        "type": "score_model",
        "name": "quality",
        "model": model,
        "input": [
            {"role": "system", "content": prompt},
            {"role": "user", "content": "Answer: {{sample.output_text}}"},
        ],
        "range": [0, 10],
        "sampling_params": {"temperature": 0, "seed": 1, "max_completions_tokens": 64},
        **extra,
    }


@dataclass
class Judge:
    engine: ScriptedEngine
    authorization: list[str | None]
    """The Authorization header of every request the judge endpoint received."""
    url: str


@pytest.fixture(scope="module")
def judge():
    engine = ScriptedEngine(StandinJudge(), model=JUDGE_MODEL)
    app = build_app(engine)
    seen: list[str | None] = []

    @app.middleware("http")
    async def record(request, call_next):
        seen.append(request.headers.get("authorization"))
        return await call_next(request)

    server, thread, port = start_in_thread(app, name="judge-standin")
    yield Judge(engine, seen, f"http://127.0.0.1:{port}/v1")
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("judged")


@pytest.fixture(scope="module")
def service(judge, data_dir):
    svc = ServiceProcess(
        data_dir, "--judge-base-url", judge.url, "--judge-api-key", JUDGE_KEY
    )  # the flag, not the environment: the job's worker can only get it from the service
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def judged_job(service, judge, tmp_path_factory):
    """A one-step RFT job whose grader is a `multi` around a score_model: (job, events)."""
    client = service.client()
    file = upload(client, tmp_path_factory.mktemp("rows"), ROWS[:2])
    grader = {
        "type": "multi",
        "name": "judged",
        "graders": {"quality": {**score_model(), "range": [0, 1]}},
        "calculate_output": "quality",
    }
    hyper = {"batch_size": 2, "n_epochs": 1, "compute_multiplier": 0.5, "reasoning_effort": "low"}
    before = judge.engine.calls
    job = create_job(client, file.id, grader=grader, hyper=hyper)
    done = wait_status(client, job.id, "succeeded", "failed", timeout_s=300)
    events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    return done, events, judge.engine.calls - before


def test_graders_run_and_validate_ask_the_judge_endpoint(service, judge):
    graders = service.client().fine_tuning.alpha.graders
    spec = score_model('Award points for "yes".')
    assert graders.validate(grader=spec).grader.type == "score_model"
    before = len(judge.authorization)
    yes = graders.run(grader=spec, model_sample="yes", item={})
    assert yes.reward == pytest.approx(10.0) and yes.sub_rewards["score"] == pytest.approx(10.0)
    assert not yes.metadata.errors.model_grader_server_error
    assert graders.run(grader=spec, model_sample="no", item={}).reward == 0.0
    multi = {
        "type": "multi",
        "name": "both",
        "graders": {"quality": spec, "exact": STRING_CHECK},
        "calculate_output": "0.5 * quality + 0.5 * exact",
    }
    out = graders.run(grader=multi, model_sample="yes", item={"reference_answer": "yes"})
    assert out.reward == pytest.approx(5.5) and set(out.sub_rewards) >= {"quality", "exact"}
    assert judge.authorization[before:] == [f"Bearer {JUDGE_KEY}"] * 3  # the spec's model
    assert judge.engine.requests[-1].model == JUDGE_MODEL

    unknown = graders.run(grader=score_model(model="no-such-model"), model_sample="yes", item={})
    assert unknown.reward == 0.0 and unknown.metadata.errors.model_grader_server_error
    assert "no-such-model" in unknown.metadata.errors.model_grader_server_error_details


def test_callers_cannot_point_the_judge_elsewhere(service):
    client = service.client()
    graders = client.fine_tuning.alpha.graders
    elsewhere = score_model(judge={"base_url": "http://127.0.0.1:9/v1"})
    key_env = {
        "type": "multi",
        "name": "m",
        "graders": {"q": score_model(judge={"model": JUDGE_MODEL, "api_key_env": "HOME"})},
        "calculate_output": "q",
    }
    for bad, text in (
        (elsewhere, "judge endpoint is the service's"),
        (key_env, "grader.graders.q.judge"),
        ({"grader": score_model(), "judge": {"base_url": "http://x"}}, "'type'"),
        ({**score_model(), "cache": "/tmp/judge.sqlite"}, "cache"),
    ):
        with pytest.raises(openai.BadRequestError, match=text):
            graders.validate(grader=bad)
    own_model = score_model(judge={"model": JUDGE_MODEL}, model="renamed-by-judge-table")
    assert graders.run(grader=own_model, model_sample="x", item={}).reward == 5.0


def test_rft_job_with_a_model_grader_succeeds(judged_job, judge):
    done, events, judge_calls = judged_job
    assert done.status == "succeeded", done.error
    assert judge_calls >= 4  # 2 prompts x 2 samples, graded in the job's worker
    steps = [e.data for e in events if e.type == "metrics"]
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["train_mean_reward"] == pytest.approx(0.5)  # every score ok: mid-range
    assert "successfully completed" in events[0].message
    assert set(judge.authorization) == {f"Bearer {JUDGE_KEY}"}


def test_the_judge_key_is_written_nowhere(judged_job, service, data_dir):
    done, _, _ = judged_job
    client = service.client()
    raw = client.fine_tuning.jobs.with_raw_response
    shown = [  # what the service answers, as sent
        raw.retrieve(done.id).text,
        raw.list().text,
        raw.list_events(done.id, limit=100).text,
        client.fine_tuning.jobs.checkpoints.with_raw_response.list(done.id).text,
        "".join(service.lines),
    ]
    assert done.id in shown[0] and "train_mean_reward" in shown[2]
    assert not [s for s in shown if JUDGE_KEY in s]
    files = [p for p in data_dir.rglob("*") if p.is_file()]
    config = data_dir / "jobs" / done.id / "config.toml"
    assert config in files
    assert 'api_key_env = "RLDOJO_JUDGE_API_KEY"' in config.read_text()
    assert [p for p in files if JUDGE_KEY.encode() in p.read_bytes()] == []


def test_without_judge_base_url_a_model_grader_is_400(tmp_path_factory, tmp_path):
    plain = ServiceProcess(  # a key alone (say, set for the whole machine) changes nothing
        tmp_path_factory.mktemp("plain"), env={"RLDOJO_JUDGE_API_KEY": JUDGE_KEY}
    )
    try:
        client = plain.client()
        file = upload(client, tmp_path)
        multi = {
            "type": "multi",
            "name": "m",
            "graders": {"exact": STRING_CHECK, "quality": score_model()},
            "calculate_output": "exact + quality",
        }
        for grader, where in ((score_model(), "grader:"), (multi, "grader.graders.quality:")):
            with pytest.raises(openai.BadRequestError) as info:
                create_job(client, file.id, grader=grader)
            message = info.value.body["message"]
            assert where in message and "--judge-base-url" in message, message
            assert info.value.body["param"] == "method.reinforcement.grader"
            with pytest.raises(openai.BadRequestError, match="--judge-base-url"):
                client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x", item={})
        assert create_job(client, file.id).status in ("validating_files", "queued")
    finally:
        plain.stop()
