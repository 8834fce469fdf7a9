"""OpenAI grader types that call out: score_model and label_model (through the openai SDK
to a scripted stand-in server on loopback), cosine similarity (embeddings endpoint) and
python (run in the sandbox). Expected scores are computed by hand."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest
from judge_standin import StandinJudge

from rldojo.graders import GraderSpecError, load
from rldojo.graders.offline import GradeRow, row_task_rollout
from rldojo.inference import ScriptedEngine, start_server

ITEM = {"question": "What is the capital of France?", "answer": "Paris"}


@pytest.fixture(scope="module")
def judge_server():
    engine = ScriptedEngine(StandinJudge())
    with start_server(engine) as server:
        yield server


def judge_table(server, **extra):
    return {"base_url": server.url, "model": server.model, **extra}


def grade(spec, text, item=ITEM):
    async def run():
        grader = load(spec, cache=False)
        task, rollout = row_task_rollout(GradeRow(1, item, {"output_text": text}, {}))
        try:
            return await grader.grade(rollout, task)
        finally:
            await grader.close()

    return asyncio.run(run())


def score_model(server, **extra):
    judge = judge_table(server) if server is not None else {}
    return {
        "type": "score_model",
        "name": "quality",
        "model": "gpt-4o-2024-08-06",
        "input": [
            {"role": "system", "content": 'Award points for mentioning "Paris" and "capital".'},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Question: {{item.question}}\n"},
                    {"type": "input_text", "text": "Answer: {{sample.output_text}}"},
                ],
            },
        ],
        "range": [0, 10],
        "pass_threshold": 5,
        "sampling_params": {"temperature": 0.2, "seed": 42, "max_completions_tokens": 300},
        "judge": judge,
        **extra,
    }


@pytest.mark.parametrize(
    ("text", "value", "passed"),
    [
        ("Paris is the capital.", 10.0, 1.0),  # both keywords: 0 + 2/2 * (10 - 0)
        ("Paris.", 5.0, 1.0),  # one of two: 5.0 >= pass_threshold 5
        ("Lyon.", 0.0, 0.0),
    ],
)
def test_score_model(judge_server, text, value, passed):
    score = grade(score_model(judge_server), text)
    assert score.status == "ok"
    assert score.value == pytest.approx(value)
    assert dict(score.components) == {"score": pytest.approx(value), "pass": passed}
    prov = score.provenance
    assert prov["judge_model"] == "scripted-judge"  # the judge table renames the model
    assert prov["sampling"]["temperature"] == 0.2 and prov["seed"] == 42
    assert len(prov["template_hash"]) == 16


def test_score_model_request_reaches_the_server_as_specified(judge_server):
    before = judge_server.engine.calls
    grade(score_model(judge_server), "Paris, a capital city")
    request = judge_server.engine.requests[before]
    assert (request.temperature, request.seed, request.max_tokens) == (0.2, 42, 300)
    assert request.messages[0]["role"] == "system"
    user = request.messages[1]["content"]
    # the sample is fenced as data, with its nonce
    assert re.search(
        r"Answer: \n<<<SAMPLE (\w{12})>>>\nParis, a capital city\n<<<END SAMPLE \1>>>", user
    )


def test_score_model_out_of_range_reply_is_invalid_not_zero():
    def reply(request):
        nonce = re.search(r'"sample_id": "(\w+)"', request.messages[0]["content"]).group(1)
        return json.dumps({"sample_id": nonce, "result": 42})

    engine = ScriptedEngine(reply)
    with start_server(engine) as server:
        score = grade(score_model(server), "Paris")
    assert score.status == "invalid" and score.value is None
    assert "outside the range" in score.explanation
    assert engine.calls == 2  # the reply, then one repair turn


def test_score_model_repair_turn_recovers():
    engine = ScriptedEngine(StandinJudge(broken_first=True))
    with start_server(engine) as server:
        score = grade(score_model(server), "Paris is the capital")
    assert score.status == "ok" and score.value == 10.0
    assert score.provenance["attempts"] == 2
    assert engine.requests[1].messages[-1]["content"].startswith("Your reply could not be used")


def test_unreachable_judge_is_an_error_not_zero():
    spec = score_model(None, judge={"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    spec["judge"] |= {"max_retries": 1, "backoff_s": 0.01, "timeout_s": 2}
    score = grade(spec, "Paris")
    assert score.status == "error" and score.value is None
    assert "after 2 attempts" in score.explanation


def label_model(server):
    return {
        "type": "label_model",
        "name": "sentiment",
        "model": "o4-mini",
        "input": [{"role": "user", "content": "Classify: {{sample.output_text}}"}],
        "labels": ["positive", "negative", "neutral"],
        "passing_labels": ["positive"],
        "judge": judge_table(server),
    }


@pytest.mark.parametrize(
    ("text", "label", "value"),
    [
        ("I feel positive", "positive", 1.0),
        ("so negative", "negative", 0.0),
        ("meh", "neutral", 0.0),
    ],
)
def test_label_model(judge_server, text, label, value):
    score = grade(label_model(judge_server), text)
    assert score.status == "ok" and score.value == value
    assert score.provenance["label"] == label


def test_cosine_uses_the_configured_embedding_model(judge_server):
    spec = {
        "type": "text_similarity",
        "name": "cos",
        "evaluation_metric": "cosine",
        "input": "{{sample.output_text}}",
        "reference": "{{item.answer}}",
        "embedding": {"base_url": judge_server.url, "model": judge_server.model},
    }
    # the stand-in embeds texts as letter counts: "aab" -> (2, 1), "ab" -> (1, 1)
    assert grade(spec, "aab", {"answer": "ab"}).value == pytest.approx(3 / 10**0.5)
    assert grade(spec, "ba", {"answer": "ab"}).value == pytest.approx(1.0)


def test_model_grader_spec_errors(judge_server):
    base = label_model(judge_server)
    cases = [
        ({**base, "passing_labels": ["great"]}, r"spec\.passing_labels: .*'great' is not a label"),
        ({**base, "labels": []}, r"spec\.labels: expected a non-empty list"),
        ({**base, "input": []}, r"spec\.input: expected a non-empty list"),
        ({**base, "input": [{"role": "robot", "content": "x"}]}, r"spec\.input\[0\]\.role"),
        (
            {**base, "input": [{"role": "user", "content": "{{oops.x}}"}]},
            r"spec\.input\[0\]\.content",
        ),
        ({**score_model(judge_server), "range": [1, 0]}, r"spec\.range: expected \[low, high\]"),
        (
            {**score_model(judge_server), "sampling_params": {"temp": 1}},
            r"spec\.sampling_params\.temp: unknown key",
        ),
        ({k: v for k, v in base.items() if k != "judge"}, r"spec\.judge: no judge backend"),
    ]
    for spec, message in cases:
        with pytest.raises(GraderSpecError, match=message):
            load(spec, cache=False)


# ------------------------------------------------------------------------------ python


@pytest.fixture(scope="module")
def sandbox():
    try:
        from rldojo import sandbox as sb

        result = sb.run("print(1)", timeout_s=10)
    except Exception as exc:
        pytest.skip(f"rldojo.sandbox is not usable here: {type(exc).__name__}: {exc}")
    if result.status != "ok":
        pytest.skip(f"rldojo.sandbox is not usable here: {result.status} {result.stderr[-200:]}")
    return sb


def python_spec(source, **extra):
    return {"type": "python", "name": "py", "source": source, **extra}


OVERLAP = """
def grade(sample, item):
    out = sample["output_text"].strip()
    if out == item["answer"]:
        return 1.0
    return len(set(out) & set(item["answer"])) / len(set(item["answer"]))
"""


@pytest.mark.slow  # the sandbox
def test_python_grader_in_the_sandbox(sandbox):
    assert grade(python_spec(OVERLAP), "Paris").value == 1.0
    # {P, a} of {P, a, r, i, s}
    assert grade(python_spec(OVERLAP), "Pa").value == pytest.approx(2 / 5)


@pytest.mark.slow  # the sandbox
def test_python_grader_never_runs_in_process(sandbox, tmp_path):
    marker = tmp_path / "touched"
    source = f"""
import os
def grade(sample, item):
    open({str(marker)!r}, "w").write("x")
    return 1.0 if os.getpid() == {os.getpid()} else 0.5
"""
    score = grade(python_spec(source), "anything")
    # writing into the host's directory fails inside the sandbox: an error, not a reward
    assert score.status == "error" and not marker.exists()
    pid = os.getpid()
    source = (
        f"import os\ndef grade(sample, item):\n    return 1.0 if os.getpid() == {pid} else 0.5\n"
    )
    assert grade(python_spec(source), "anything").value == 0.5


@pytest.mark.slow  # the sandbox
@pytest.mark.parametrize(
    ("source", "status", "message"),
    [
        ("def grade(sample, item):\n    return 1 / 0\n", "error", "ZeroDivisionError"),
        ("def grade(sample, item):\n    return 'high'\n", "invalid", "not a number"),
        ("def grade(sample, item):\n    return float('nan')\n", "invalid", "not a finite number"),
        ("def grade(sample, item):\n    while True:\n        pass\n", "timeout", "ran past"),
    ],
)
def test_python_grader_failures_are_statuses(sandbox, source, status, message):
    # A short limit only where it is under test (a loop that never ends); the others end
    # at once, and a generous limit keeps a slow sandbox start from cutting them off.
    score = grade(python_spec(source, timeout_s=5 if status == "timeout" else 60), "x")
    assert score.status == status and score.value is None
    assert message in score.explanation


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def grade(sample, item)\n    return 1\n", r"spec\.source: line 1"),
        ("def score(sample, item):\n    return 1\n", r"spec\.source: no top-level `def grade"),
        ("def grade(sample):\n    return 1\n", r"spec\.source: grade\(\) must take"),
    ],
)
def test_python_grader_source_is_checked_at_load_without_running_it(source, message):
    with pytest.raises(GraderSpecError, match=message):
        load(python_spec(source), cache=False)


@pytest.mark.slow  # the sandbox
@pytest.mark.parametrize(
    ("extra", "value", "status"),
    [
        ({}, "7.5", "invalid"),  # OpenAI's graders return [0, 1]
        ({}, "-0.5", "invalid"),
        ({}, "1.0", "ok"),
        ({"score_range": [-1, 10]}, "7.5", "ok"),
        ({"score_range": [-1, 10]}, "-1", "ok"),
        ({"score_range": [-1, 10]}, "10.5", "invalid"),
    ],
)
def test_python_grader_results_outside_score_range_are_invalid(sandbox, extra, value, status):
    source = f"def grade(sample, item):\n    return {value}\n"
    score = grade(python_spec(source, **extra), "x")
    assert score.status == status
    if status == "ok":
        assert score.value == float(value)
    else:
        assert score.value is None and "outside score_range" in score.explanation


@pytest.mark.parametrize("bad", [[1, 0], [0], "0..1", [0, float("inf")], [True, 2]])
def test_python_grader_score_range_is_checked_at_load(bad):
    spec = python_spec("def grade(sample, item):\n    return 1\n", score_range=bad)
    with pytest.raises(GraderSpecError, match=r"spec\.score_range: expected \[low, high\]"):
        load(spec, cache=False)


@pytest.mark.slow  # the sandbox
def test_python_grader_printing_10_mb_keeps_its_result(sandbox):
    # print() goes to stderr while grade() runs: the result line on stdout survives
    source = "def grade(sample, item):\n    print('x' * 10_000_000)\n    return 0.25\n"
    score = grade(python_spec(source), "x")
    assert score.status == "ok" and score.value == 0.25


@pytest.mark.slow  # the sandbox
def test_python_grader_flooding_stdout_is_named(sandbox):
    # a write below print() floods the captured stdout and pushes the result out
    source = "import os\ndef grade(sample, item):\n    os.write(1, b'x' * (3 << 20))\n    return 1"
    score = grade(python_spec(source), "x")
    assert score.status == "error" and score.value is None
    assert "more output than the sandbox keeps" in score.explanation
