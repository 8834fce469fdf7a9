"""Grader edges a new user hits: template typos found before grading, a non-zero exit
when no row could be scored, and a pass threshold for partial-credit graders in training."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.config import TrainConfig
from rldojo.graders.openai_templates import TemplateError
from rldojo.graders.template_check import check_spec_templates, spec_templates
from rldojo.report.metrics import read_metrics
from rldojo.training.inputs import build_mixture, pass_threshold

runner = CliRunner()
ROWS = [
    {"item": {"answer": "4", "note": "a"}, "sample": {"output_text": "4"}},
    {"item": {"answer": "5"}, "sample": {"output_text": "6"}},
]


def _write(tmp_path, spec, rows=ROWS):
    (tmp_path / "g.json").write_text(json.dumps(spec))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["grade", "--grader", str(tmp_path / "g.json"), "--data",
            str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "o.jsonl")]  # fmt: skip


def _check(field: str, value: str) -> dict:
    spec = {"type": "string_check", "name": "s", "operation": "eq",
            "input": "{{sample.output_text}}", "reference": "{{item.answer}}"}  # fmt: skip
    return {**spec, field: value}


TYPOS = [
    ("input", "{{sample.output_txt}}",
     ["spec.input", "sample has no 'output_txt'", "did you mean 'output_text'"]),
    ("reference", "{{ item.answr }}",
     ["spec.reference", "{{item.answr}}", "none of the 2 rows", "did you mean 'answer'"]),
]  # fmt: skip


@pytest.mark.parametrize(("field", "template", "needles"), TYPOS)
def test_template_typo_is_one_line_before_grading(tmp_path, field, template, needles):
    result = runner.invoke(app, _write(tmp_path, _check(field, template)))
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "o.jsonl").exists()  # nothing was graded


def test_a_field_that_only_some_rows_have_is_graded_row_by_row(tmp_path):
    result = runner.invoke(app, _write(tmp_path, _check("reference", "{{item.note}}")))
    assert result.exit_code == 0, result.output
    scored = [json.loads(x)["score"] for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [s["status"] for s in scored] == ["ok", "invalid"]
    assert scored[0]["value"] == 0.0  # "4" is not "a"


def test_templates_are_every_string_of_the_spec_but_python_source():
    spec = {"type": "multi", "graders": {"a": _check("input", "{{sample.x}}"),
            "b": {"type": "python", "source": "d = {{1: 2}}"}},
            "input": [{"role": "user", "content": "Q {{item.q}}"}]}  # fmt: skip
    assert sorted(f for f, _ in spec_templates(spec)) == [
        "spec.graders.a.input", "spec.graders.a.reference", "spec.input[0].content",
    ]  # fmt: skip


def test_sample_paths_before_sampling_are_checked_by_first_key():
    spec = _check("input", "{{sample.output_json.verdict}}")
    views = [({}, {"answer": "1"})]
    keys = ("output_text", "output_json")
    check_spec_templates(spec, views, "the task", sample_keys=keys)  # output unknown yet
    with pytest.raises(TemplateError, match="sample has no 'output'"):
        check_spec_templates(_check("input", "{{sample.output}}"), views, "x", sample_keys=keys)


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_every_row_failing_exits_non_zero_with_the_first_reason(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    spec = {"grader": {"type": "score_model", "name": "j", "model": "m",
                       "input": [{"role": "user", "content": "Rate {{sample.output_text}}"}]},
            "judge": {"base_url": url, "max_retries": 0}, "cache": False}  # fmt: skip
    result = runner.invoke(app, _write(tmp_path, spec))
    assert result.exit_code == 1, result.output
    assert "no row was scored (2 failed)" in result.output
    assert "judge call failed" in result.output
    scored = [json.loads(x)["score"] for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [s["status"] for s in scored] == ["error", "error"]  # the outputs are written
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summary["statuses"] == {"error": 2}


def test_pass_threshold_resolution():
    spec = {"type": "text_similarity", "name": "t", "input": "{{sample.output_text}}",
            "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match",
            "pass_threshold": 0.8}  # fmt: skip
    base = {"model": {"name": "tiny-random"}, "eval": {"tasks": 2}}
    assert pass_threshold(TrainConfig(**base), None) == 1.0
    config = TrainConfig(**base, grader={"spec": spec})
    assert pass_threshold(config, build_mixture(config)) == 0.8
    config = TrainConfig(**base, grader={"spec": spec, "pass_threshold": 0.3})
    assert pass_threshold(config, build_mixture(config)) == 0.3


def test_grader_template_typo_fails_training_before_the_run_dir(tmp_path):
    spec = _check("reference", "{{item.answr}}")
    config = tmp_path / "c.toml"
    config.write_text(f'[model]\nname = "tiny-random"\n[run]\noutput_dir = "{tmp_path / "r"}"\n'
                      f"[grader]\nspec = {json.dumps(json.dumps(spec))}\n")  # fmt: skip
    result = runner.invoke(app, ["train", str(config)])
    assert result.exit_code == 2, result.output
    assert "item has no 'answr'" in result.output and "tasks of env arith-v1" in result.output
    assert "did you mean 'answer'" in result.output
    assert not (tmp_path / "r").exists()


PARTIAL = "def grade(sample, item):\n    return 0.5\n"


@pytest.mark.slow
@pytest.mark.parametrize(("threshold", "rate"), [(None, 0.0), (0.5, 1.0)])
def test_partial_credit_grader_pass_rate_follows_the_threshold(tmp_path, threshold, rate):
    spec = {"type": "python", "name": "half", "source": PARTIAL}
    grader = {"spec": spec} if threshold is None else {"spec": spec, "pass_threshold": threshold}
    config = tmp_path / "c.toml"
    import tomli_w

    config.write_text(tomli_w.dumps({
        "model": {"name": "tiny-random"}, "grader": grader, "eval": {"tasks": 2},
        "sampling": {"max_new_tokens": 4},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "dynamic_sampling": False},
        "run": {"steps": 1, "output_dir": str(tmp_path / "runs"), "name": "x"},
    }))  # fmt: skip
    result = runner.invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
    train = [m for m in read_metrics(tmp_path / "runs" / "x") if m["kind"] == "train"]
    assert train[0]["reward/mean"] == 0.5 and train[0]["reward/pass_rate"] == rate
    assert ("pass(>=0.5)" in result.output) == (threshold is not None)
    state = json.loads((tmp_path / "runs" / "x" / "summary.json").read_text())
    assert state["evals"]["after"]["accuracy"] == rate
