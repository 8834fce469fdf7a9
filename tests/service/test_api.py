"""Auth, key isolation, graders validate/run and every kind of bad input: 400/401/404/413
or a `failed` job with a one-line reason, never a 500 or a hang (openai client + raw HTTP)."""

from __future__ import annotations

import httpx
import openai
import pytest
from service.helpers import (
    KEY_A,
    KEY_B,
    MULTI,
    PYTHON,
    ROWS,
    STRING_CHECK,
    ServiceProcess,
    create_job,
    upload,
    wait_status,
)

pytestmark = pytest.mark.slow  # a service subprocess


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = ServiceProcess(tmp_path_factory.mktemp("api"), "--max-file-mb", "0.01")
    yield svc
    svc.stop()


def _raw(service, method: str, path: str, key: str | None = KEY_A, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, service.url + path, headers=headers, timeout=60, **kw)


def _is_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    return error


def test_requests_without_a_valid_key_get_401(service):
    for key in (None, "sk-wrong"):
        for method, path in (("GET", "/files"), ("GET", "/models"), ("POST", "/fine_tuning/jobs")):
            error = _is_openai_error(_raw(service, method, path, key=key), 401)
            assert error["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        service.client("sk-wrong").files.list()


def test_another_keys_objects_are_404_and_never_listed(service, tmp_path):
    alice, bob = service.client(KEY_A), service.client(KEY_B)
    file = upload(alice, tmp_path)
    job = create_job(alice, file.id)
    assert [f.id for f in bob.files.list().data] == []
    assert [j.id for j in bob.fine_tuning.jobs.list().data] == []
    for call in (
        lambda: bob.files.retrieve(file.id),
        lambda: bob.files.content(file.id),
        lambda: bob.files.delete(file.id),
        lambda: bob.fine_tuning.jobs.retrieve(job.id),
        lambda: bob.fine_tuning.jobs.cancel(job.id),
        lambda: bob.fine_tuning.jobs.list_events(job.id),
        lambda: bob.fine_tuning.jobs.checkpoints.list(job.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError, match="no such file"):  # can't train on it
        create_job(bob, file.id)
    assert alice.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    assert alice.files.content(file.id).text.startswith('{"messages"')
    assert alice.files.delete(file.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(file.id)


def test_graders_validate_and_run(service):
    client = service.client()
    graders = client.fine_tuning.alpha.graders
    assert graders.validate(grader=STRING_CHECK).grader.type == "string_check"
    item = {"reference_answer": "yes"}
    assert graders.run(grader=STRING_CHECK, model_sample="yes", item=item).reward == 1.0
    assert graders.run(grader=STRING_CHECK, model_sample="no", item=item).reward == 0.0
    out = graders.run(grader=PYTHON, model_sample="x" * 10, item=item)  # in the sandbox
    assert out.reward == pytest.approx(0.5) and not out.metadata.errors.python_grader_runtime_error
    multi = graders.run(grader=MULTI, model_sample="yes", item=item)
    assert multi.reward == pytest.approx(1.0) and set(multi.sub_rewards) >= {"exact", "sim"}
    broken = {**PYTHON, "source": "def grade(sample, item):\n    return 1 / 0\n"}
    failed = graders.run(grader=broken, model_sample="x", item=item)
    assert failed.reward == 0.0 and failed.metadata.errors.python_grader_runtime_error
    missing = graders.run(grader=STRING_CHECK, model_sample="x", item={})
    assert missing.metadata.errors.invalid_variable_error
    for bad in (
        {"type": "no_such_grader"},
        {**PYTHON, "source": "def grade(:"},
        {**STRING_CHECK, "operation": "almost"},
    ):
        with pytest.raises(openai.BadRequestError):
            graders.validate(grader=bad)
        with pytest.raises(openai.BadRequestError):
            graders.run(grader=bad, model_sample="x", item=item)


def test_bad_job_requests_are_400(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path)
    cases = {
        "grader": dict(grader={"type": "no_such_grader", "name": "x"}),
        "model": dict(model="gpt-4o"),
        "model ": dict(model=str(tmp_path)),  # a model directory the operator did not allow
        "training_file": dict(training_file="file-doesnotexist"),
        "hyperparameters": dict(hyper={"batch_size": -1}),
        "suffix": dict(suffix="has:colon"),
    }
    for param, kw in cases.items():
        args = {"model": "tiny-random", "training_file": file.id, **kw}
        grader, hyper = args.pop("grader", STRING_CHECK), args.pop("hyper", {})
        with pytest.raises(openai.BadRequestError) as info:
            client.fine_tuning.jobs.create(
                **args,
                method={
                    "type": "reinforcement",
                    "reinforcement": {"grader": grader, "hyperparameters": hyper},
                },
            )
        assert param.strip() in info.value.body["param"], (param, info.value.body)
    with pytest.raises(openai.BadRequestError, match="'dpo' is not supported"):
        client.fine_tuning.jobs.create(
            model="tiny-random", training_file=file.id, method={"type": "dpo"}
        )
    _is_openai_error(_raw(service, "POST", "/fine_tuning/jobs", content=b"{not json"), 400)
    _is_openai_error(_raw(service, "POST", "/fine_tuning/jobs", json=[1, 2]), 400)
    _is_openai_error(_raw(service, "POST", "/files", content=b"plain"), 400)
    _is_openai_error(_raw(service, "GET", "/fine_tuning/jobs?limit=0"), 400)
    _is_openai_error(_raw(service, "GET", "/fine_tuning/jobs?after=ftjob-nope"), 400)
    _is_openai_error(_raw(service, "GET", "/fine_tuning/jobs/ftjob-nope"), 404)
    _is_openai_error(
        _raw(
            service,
            "POST",
            "/chat/completions",
            json={"model": "ft:nope", "messages": [{"role": "user", "content": "x"}]},
        ),
        404,
    )
    done = client.fine_tuning.jobs.cancel(create_job(client, file.id).id)
    with pytest.raises(openai.BadRequestError, match="cancelled"):
        client.fine_tuning.jobs.resume(done.id)


def test_bad_uploads_are_rejected(service, tmp_path):
    client = service.client()
    big = tmp_path / "big.jsonl"
    big.write_text("x" * 20_000)
    with big.open("rb") as f, pytest.raises(openai.APIStatusError) as info:
        client.files.create(file=f, purpose="fine-tune")
    assert info.value.status_code == 413
    with big.open("rb") as f, pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=f, purpose="batch")


def test_bad_rows_fail_the_job_with_the_line_and_field(service, tmp_path):
    client = service.client()
    broken = upload(client, tmp_path, [ROWS[0], '{"messages": [\n', ROWS[1]], "broken.jsonl")
    missing = upload(
        client, tmp_path, [ROWS[0], ROWS[1], {"messages": ROWS[2]["messages"]}], "missing.jsonl"
    )
    no_messages = upload(
        client, tmp_path, [{"prompt": "hi", "reference_answer": "x"}], "nomsg.jsonl"
    )
    expected = {
        broken.id: "broken.jsonl:2:",
        missing.id: "missing.jsonl:3: field 'reference_answer': missing",
        no_messages.id: "nomsg.jsonl:1: field 'messages'",
    }
    for file_id, text in expected.items():
        job = wait_status(client, create_job(client, file_id).id, "failed", "succeeded")
        assert job.status == "failed" and text in job.error.message, job.error
        assert "\n" not in job.error.message and job.error.code == "invalid_file"


def test_a_request_the_engine_refuses_is_a_400_naming_the_field(service):
    ask = {"model": "tiny-random", "messages": [{"role": "user", "content": "x"}]}
    reply = _raw(service, "POST", "/chat/completions", json=ask | {"max_tokens": 10**6})
    error = _is_openai_error(reply, 400)  # tiny-random's context: 2048 tokens
    assert (error["param"], error["code"]) == ("max_tokens", "invalid_value")
