"""The checks before a reinforcement job trains (`rldojo.service.preflight`): a grader
that errors on every one of the first training rows is refused at creation (a 400 in
OpenAI's shape, through the real client), `graders/validate` does the same for an item
it is given, and the learning-signal event says when little signal is expected."""

from __future__ import annotations

import openai
import pytest
from service.helpers import PYTHON, ROWS, STRING_CHECK, create_job, upload

from rldojo.service.preflight import signal_event

RAISES = {
    "type": "python",
    "name": "broken",
    "source": "def grade(sample, item):\n    return 1 / 0\n",
}


@pytest.mark.slow  # a service subprocess
def test_a_grader_that_fails_on_every_row_is_refused_at_creation(service, tmp_path):
    client = service.client()
    file = upload(client, tmp_path)
    with pytest.raises(openai.BadRequestError) as caught:
        create_job(client, file.id, grader=RAISES)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["code"] == "grader_failures" and error["param"] == "method.reinforcement.grader"
    assert "ZeroDivisionError" in error["message"] and "train.jsonl" in error["message"]
    assert "line 1" in error["message"]
    jobs = client.fine_tuning.jobs.list(limit=100).data
    assert all(j.training_file != file.id for j in jobs)  # no job was created


@pytest.mark.slow  # a service subprocess
def test_a_grader_that_scores_some_rows_is_accepted(service, tmp_path):
    client = service.client()
    # raises on the rows without a reference answer, scores the one that has it
    partial = {**RAISES, "source": "def grade(sample, item):\n    return len(item['ref'])\n"}
    rows = [{**ROWS[0], "ref": "yes"}, *ROWS[1:]]
    job = create_job(client, upload(client, tmp_path, rows).id, grader=partial)
    assert job.status in ("validating_files", "queued")
    client.fine_tuning.jobs.cancel(job.id)


@pytest.mark.slow  # a service subprocess
def test_graders_validate_tries_the_grader_on_a_given_item(service):
    client = service.client()
    item = {"reference_answer": "yes"}

    def validate(grader, **extra):
        return client.post(
            "/fine_tuning/alpha/graders/validate",
            body={"grader": grader, **extra},
            cast_to=object,
        )

    assert validate(RAISES) == {"grader": RAISES}  # no item: only loaded
    with pytest.raises(openai.BadRequestError) as caught:
        validate(RAISES, item=item, model_sample="yes")
    assert caught.value.body["code"] == "grader_failures"
    assert "ZeroDivisionError" in caught.value.body["message"]
    assert validate(STRING_CHECK, item=item, model_sample="no") == {"grader": STRING_CHECK}
    assert validate(PYTHON, item=item, model_sample="yes") == {"grader": PYTHON}


def _result(passed: int, varied: int, errors: int = 0) -> dict:
    return {"samples": 16, "passed": passed, "errors": errors, "groups": 4,
            "groups_with_variance": varied, "first_error": "ZeroDivisionError: x"}  # fmt: skip


def test_the_signal_event_warns_when_little_or_no_signal_is_expected():
    message, level = signal_event(_result(6, 3))
    assert level == "info"
    assert message == (
        "Learning-signal check: the base model passes 6 of 16 samples; 3 of 4 groups have "
        "rewards that differ"
    )
    message, level = signal_event(_result(0, 0))
    assert level == "warn" and "no learning signal expected" in message
    assert message.endswith("graders with partial credit learn faster")
    message, level = signal_event(_result(1, 0))
    assert level == "warn" and "passes 1 of 16 samples" in message
    message, level = signal_event({**_result(1, 1), "groups": 8})  # 1 of 8 groups
    assert level == "warn" and "little learning signal expected" in message
    message, level = signal_event(_result(0, 0, errors=16))
    assert level == "warn" and "the grader failed on every sample: ZeroDivisionError" in message


@pytest.mark.slow  # a service subprocess
def test_graders_run_samples_the_base_model_when_asked_for_the_signal(service, tmp_path):
    """`signal: {model, training_file}`: tiny-random writes garbage, so the exact-match
    grader passes nothing and no group's rewards differ; a length-parity grader's do."""
    client = service.client()
    file = upload(client, tmp_path)

    def run(grader, **signal):
        return client.post(
            "/fine_tuning/alpha/graders/run", cast_to=object,
            body={"grader": grader, "model_sample": "yes", "item": {"reference_answer": "yes"},
                  "signal": {"model": "tiny-random", "training_file": file.id, **signal}},
        )  # fmt: skip

    out = run(STRING_CHECK, prompts=2, samples=3)
    assert out["reward"] == 1.0  # the item's grade, as without `signal`
    signal = out["signal"]
    assert (signal["samples"], signal["groups"]) == (6, 2)
    assert signal["passed"] == 0 and signal["groups_with_variance"] == 0
    assert signal["level"] == "warn" and "no learning signal expected" in signal["message"]
    parity = {**RAISES, "source": "def grade(sample, item):\n"
              "    return float(len(sample['output_text']) % 2)\n"}  # fmt: skip
    varied = run(parity, prompts=2, samples=3)["signal"]
    assert varied["errors"] == 0 and varied["groups_with_variance"] >= 1
    with pytest.raises(openai.BadRequestError) as caught:
        run(STRING_CHECK, prompts=99)
    assert caught.value.body["param"] == "signal.prompts"
    missing = {"model": "tiny-random", "training_file": "file-nope"}
    with pytest.raises(openai.NotFoundError):
        client.post("/fine_tuning/alpha/graders/run", cast_to=object,
                    body={"grader": STRING_CHECK, "item": {}, "signal": missing})  # fmt: skip
