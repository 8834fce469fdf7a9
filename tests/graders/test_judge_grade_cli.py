"""`rldojo grade` and `rldojo eval-judge`: files in, scores and summaries out; re-grading
the same file makes zero new judge calls (counted on the stand-in server)."""

from __future__ import annotations

import json

import pytest
from judge_standin import StandinJudge
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.inference import ScriptedEngine, start_server

runner = CliRunner()
TEXTS = ["12", "12 because 7 + 5", "13", "12", "It is 13, because", "twelve"]
LABELS = ["pass", "fail", "fail", "pass", "fail", "pass"]


@pytest.fixture()
def server():
    engine = ScriptedEngine(StandinJudge())
    with start_server(engine) as handle:
        yield handle


def write_rows(path, texts, labels=None):
    with path.open("w") as f:
        for i, text in enumerate(texts):
            row = {
                "item": {"question": "What is 7 + 5?", "answer": "12"},
                "sample": {"output_text": text},
            }
            if labels is not None:
                row["label"] = labels[i]
            f.write(json.dumps(row) + "\n")
    return path


def write_spec(path, server):
    spec = {
        "type": "rubric",
        "judge": {"base_url": server.url, "model": server.model},
        "criteria": [
            {"id": "correct", "text": 'Says "12"', "points": 2},
            {"id": "explains", "text": 'Explains "because"', "points": 2},
            {"id": "wrong", "text": 'Says "13"', "points": -1},
        ],
        "pass_threshold": 0.5,
    }
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.slow
def test_grade_file_summary_and_free_regrading(tmp_path, server):
    data = write_rows(tmp_path / "samples.jsonl", TEXTS)
    spec = write_spec(tmp_path / "rubric.json", server)
    out = tmp_path / "scored.jsonl"
    args = [
        "grade",
        "--grader",
        str(spec),
        "--data",
        str(data),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "judge.sqlite"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    # values: 2/4, 4/4, -1/4 -> 0, 2/4, (2-1)/4, 0
    assert [r["score"]["value"] for r in scored] == [0.5, 1.0, 0.0, 0.5, 0.25, 0.0]
    assert scored[0]["sample"]["output_text"] == "12" and scored[0]["score"]["status"] == "ok"
    summary = json.loads((tmp_path / "scored.jsonl.summary.json").read_text())
    assert summary["rows"] == 6 and summary["statuses"] == {"ok": 6}
    assert summary["mean"] == pytest.approx(2.25 / 6)
    assert summary["pass_rate"] == pytest.approx(3 / 6)  # >= 0.5: rows 1, 2, 4
    assert summary["components"] == {
        "correct": pytest.approx(3 / 6),
        "explains": pytest.approx(2 / 6),
        "wrong": pytest.approx(2 / 6),
    }
    # "12" appears twice: the second is served by the in-flight/cached reply
    assert summary["judge"]["calls"] == 5 and server.engine.calls == 5
    assert summary["samples_per_s"] > 0
    assert "6 rows: mean 0.375, pass rate 50.0%" in result.output

    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert server.engine.calls == 5  # zero new judge calls
    summary = json.loads((tmp_path / "scored.jsonl.summary.json").read_text())
    assert summary["judge"]["calls"] == 0 and summary["judge"]["cache_hit_rate"] == 1.0
    assert [json.loads(x)["score"]["value"] for x in out.read_text().splitlines()] == [
        0.5,
        1.0,
        0.0,
        0.5,
        0.25,
        0.0,
    ]


def test_bad_rows_and_specs_are_one_line_errors(tmp_path, server):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"item": {}, "sample": {"output_text": "x"}}\n{"item": {}}\n')
    spec = write_spec(tmp_path / "rubric.json", server)
    result = runner.invoke(
        app,
        ["grade", "--grader", str(spec), "--data", str(data), "--out", str(tmp_path / "o.jsonl")],
    )
    assert result.exit_code == 2
    assert "bad.jsonl:2: field 'sample': missing" in result.output
    good = write_rows(tmp_path / "good.jsonl", ["x"])
    bad_spec = tmp_path / "spec.json"
    bad_spec.write_text(
        json.dumps({"type": "string_check", "operation": "is", "input": "", "reference": ""})
    )
    result = runner.invoke(
        app,
        [
            "grade",
            "--grader",
            str(bad_spec),
            "--data",
            str(good),
            "--out",
            str(tmp_path / "o.jsonl"),
        ],
    )
    assert result.exit_code == 2 and "spec.operation: expected one of" in result.output


@pytest.mark.slow
def test_eval_judge_agreement_and_probes(tmp_path, server):
    labels = write_rows(tmp_path / "labeled.jsonl", TEXTS, LABELS)
    spec = write_spec(tmp_path / "rubric.json", server)
    report_path = tmp_path / "report.json"
    result = runner.invoke(
        app,
        [
            "eval-judge",
            "--grader",
            str(spec),
            "--labels",
            str(labels),
            "--out",
            str(report_path),
            "--cache",
            "off",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    agree = report["agreement"]
    # judge (value >= 0.5): pass pass fail pass fail fail; human: pass fail fail pass fail pass
    assert agree["accuracy"] == pytest.approx(4 / 6)
    # p_o = 4/6; human 3 pass/3 fail, judge 3/3 -> p_e = 1/2; kappa = (2/3 - 1/2) / (1/2)
    assert agree["kappa"] == pytest.approx(1 / 3)
    assert agree["confusion"] == {"fail": {"fail": 2, "pass": 1}, "pass": {"fail": 1, "pass": 2}}
    assert report["length_bias"]["mean_delta"] == 0.0  # keywords only: padding changes nothing
    assert report["position_bias"] is None  # not a group judge
    assert "accuracy 66.7%, Cohen's kappa 0.333" in result.output


def test_commands_are_registered():
    result = runner.invoke(app, ["--help"])
    for name in ("serve", "grade", "eval-judge"):
        assert name in result.output
