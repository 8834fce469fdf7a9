"""OpenAI grader specs without a model: string_check, text_similarity, multi, templates,
TOML specs and malformed specs (errors name the field)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from rldojo.graders import GraderSpecError, load
from rldojo.graders.offline import GradeRow, row_task_rollout

ITEM = {"answer": "Paris", "answers": ["Lyon", "Paris"], "meta": {"country": "France"}}


def grade(spec, text, item=ITEM, sample_extra=None, **kw):
    grader = load(spec, cache=False, **kw)
    sample = {"output_text": text, **(sample_extra or {})}
    task, rollout = row_task_rollout(GradeRow(1, item, sample, {}))
    return asyncio.run(grader.grade(rollout, task))


def check(op, reference="{{item.answer}}", text_template="{{sample.output_text}}"):
    return {
        "type": "string_check",
        "name": "s",
        "operation": op,
        "input": text_template,
        "reference": reference,
    }


@pytest.mark.parametrize(
    ("op", "text", "expected"),
    [
        ("eq", "Paris", 1.0),
        ("eq", "Paris.", 0.0),
        ("ne", "Paris.", 1.0),
        ("like", "It is Paris.", 1.0),
        ("like", "It is paris.", 0.0),
        ("ilike", "It is PARIS.", 1.0),
    ],
)
def test_string_check(op, text, expected):
    score = grade(check(op), text)
    assert score.status == "ok" and score.value == expected
    assert score.provenance["type"] == "string_check"


def test_templates_nested_paths_and_output_json():
    assert grade(check("eq", "{{item.answers[1]}}"), "Paris").value == 1.0
    assert grade(check("eq", "{{ item.answers.0 }}"), "Lyon").value == 1.0
    assert grade(check("ilike", "{{item.meta.country}}"), "france!").value == 1.0
    spec = check("eq", text_template="{{sample.output_json.city}}")
    assert grade(spec, json.dumps({"city": "Paris"})).value == 1.0
    # a sample row may carry output_json itself
    assert grade(spec, "ignored", sample_extra={"output_json": {"city": "Paris"}}).value == 1.0


def test_missing_template_value_is_invalid_naming_the_field():
    score = grade(check("eq", "{{item.reference}}"), "Paris")
    assert score.status == "invalid" and score.value is None
    assert "spec.reference" in score.explanation and "'reference'" in score.explanation
    score = grade(check("eq", text_template="{{sample.output_json.city}}"), "not json")
    assert score.status == "invalid"


def similarity_spec(metric, **extra):
    return {
        "type": "text_similarity",
        "name": "sim",
        "evaluation_metric": metric,
        "input": "{{sample.output_text}}",
        "reference": "{{item.reference}}",
        **extra,
    }


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("fuzzy_match", 1.0),
        ("bleu", math.exp(-1)),  # brevity penalty exp(1 - 6/3), all n-grams match
        ("gleu", 1 / 3),
        ("rouge_1", 2 / 3),
        ("rouge_2", 2 * 0.4 / 1.4),
        ("rouge_l", 2 / 3),
    ],
)
def test_text_similarity(metric, expected):
    item = {"reference": "the cat sat on the mat"}
    text = "the cat sat on the mat" if metric == "fuzzy_match" else "the cat sat"
    score = grade(similarity_spec(metric), text, item)
    assert score.status == "ok"
    assert score.value == pytest.approx(expected)


def test_text_similarity_pass_threshold_component():
    item = {"reference": "the cat sat on the mat"}
    spec = similarity_spec("rouge_1", pass_threshold=0.5)
    assert dict(grade(spec, "the cat sat", item).components) == {"pass": 1.0}
    spec = similarity_spec("rouge_1", pass_threshold=0.9)
    assert dict(grade(spec, "the cat sat", item).components) == {"pass": 0.0}


def multi(formula, **graders):
    return {"type": "multi", "name": "m", "graders": graders, "calculate_output": formula}


def test_multi_formula_over_named_graders():
    spec = multi(
        "0.5 * exact + 0.25 * near + 0.25 * max(sim, 0.9) ^ 2",
        exact=check("eq"),
        near=check("ilike"),
        sim=similarity_spec("rouge_1"),
    )
    item = {**ITEM, "reference": "the capital is paris"}
    score = grade(spec, "The capital is Paris", item)
    # exact 0, near 1, rouge_1("The capital is Paris", ref) = 1.0 (case-insensitive tokens)
    assert score.status == "ok"
    assert score.value == pytest.approx(0.5 * 0 + 0.25 * 1 + 0.25 * 1.0)
    assert dict(score.components) == {"exact": 0.0, "near": 1.0, "sim": pytest.approx(1.0)}
    assert score.provenance["calculate_output"].startswith("0.5 * exact")


def test_multi_nested_and_failure_propagates():
    inner = multi("a * 2", a=check("eq"))
    spec = multi("outer + 1", outer=inner)
    assert grade(spec, "Paris").value == 3.0
    broken = multi("a + b", a=check("eq"), b=check("eq", "{{item.nope}}"))
    score = grade(broken, "Paris")
    assert score.status == "invalid" and score.value is None
    assert "b: invalid" in score.explanation


def test_multi_formula_that_cannot_be_evaluated_is_invalid():
    score = grade(multi("1 / a", a=check("eq")), "Lyon")  # a = 0
    assert score.status == "invalid" and "division by zero" in score.explanation


def test_same_grader_in_rldojo_toml(tmp_path):
    path = tmp_path / "grader.toml"
    path.write_text(
        """
type = "multi"
name = "combo"
calculate_output = "0.5 * exact + 0.5 * fuzzy"

[graders.exact]
type = "string_check"
operation = "eq"
input = "{{sample.output_text}}"
reference = "{{item.answer}}"

[graders.fuzzy]
type = "text_similarity"
evaluation_metric = "fuzzy_match"
input = "{{sample.output_text}}"
reference = "{{item.answer}}"
"""
    )
    assert grade(str(path), "Paris").value == 1.0
    json_path = tmp_path / "grader.json"
    json_path.write_text(json.dumps(check("eq")))
    assert grade(json_path, "Paris").value == 1.0
    assert grade(json.dumps(check("eq")), "Lyon").value == 0.0  # JSON text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "x"}, r"spec\.type: missing"),
        ({"type": "regex"}, r"spec\.type: unknown grader type 'regex'"),
        ({**check("eq"), "operation": "equals"}, r"spec\.operation: expected one of eq, ne"),
        ({k: v for k, v in check("eq").items() if k != "input"}, r"spec\.input: missing"),
        ({**check("eq"), "refrence": "x"}, r"spec\.refrence: unknown key"),
        ({**check("eq"), "reference": 3}, r"spec\.reference: expected str, got int"),
        (check("eq", "{{answer}}"), r"spec\.reference: .*unknown namespace 'answer'"),
        (check("eq", "{{item}}"), r"spec\.reference: \{\{item\}\} names a namespace"),
        (check("eq", "{{items.answer}}"), r"spec\.reference: .*unknown namespace 'items'"),
        (check("eq", "{{item..a}}"), r"spec\.reference: malformed template variable"),
        (similarity_spec("bertscore"), r"spec\.evaluation_metric: expected one of"),
        (similarity_spec("cosine"), r"spec: cosine needs an embedding model"),
        (multi("a + c", a=check("eq")), r"spec\.calculate_output: unknown name 'c'"),
        (multi("a +", a=check("eq")), r"spec\.calculate_output: unexpected end"),
        (multi("a", a={**check("eq"), "operation": "is"}), r"spec\.graders\.a\.operation"),
        (multi("a"), r"spec\.graders: needs at least one grader"),
        (multi("a", a="string_check"), r"spec\.graders\.a: expected a grader table"),
    ],
)
def test_malformed_specs_name_the_field(spec, message):
    with pytest.raises(GraderSpecError, match=message):
        load(spec, cache=False)


def test_unreadable_spec_files(tmp_path):
    with pytest.raises(GraderSpecError, match="not found"):
        load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(GraderSpecError, match="invalid JSON"):
        load(str(bad))
    with pytest.raises(GraderSpecError, match="spec: invalid JSON"):
        load("{oops")
