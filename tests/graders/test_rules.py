"""Rule graders: answer extraction, exact match, format term, math-verify in a worker."""

from __future__ import annotations

import asyncio
import importlib
import textwrap
import time
from pathlib import Path

import pytest

from rldojo.graders.rules import (
    ExactMatchGrader,
    FormatGrader,
    MathVerifyGrader,
    _warm_math_verify,
    answer_instruction,
    extract_answer,
    has_answer_line,
    normalize_answer,
)
from rldojo.types import Rollout, Score, Task
from rldojo.workers.isolation_pool import IsolatedPool


def _rollout(text: str) -> Rollout:
    return Rollout(task_id="t", env="test", messages=[], completion=text)


def _grade(grader, text: str, answer: str | None) -> Score:
    return asyncio.run(grader.grade(_rollout(text), Task(id="t", prompt="q", answer=answer)))


@pytest.fixture(scope="module")
def mv_pool():
    pool = IsolatedPool(1, initializer=_warm_math_verify)
    pool.start()
    yield pool
    pool.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7 + 5 = 12\nAnswer: 12", "12"),
        ("Answer: 3\nWait, no.\nAnswer: 4.", "4"),  # the last answer line wins
        ("  Answer:   $\\frac{1}{2}$  ", "\\frac{1}{2}"),
        ("Answer: \\(x^2\\)!", "x^2"),
        ("**Answer:** 19", "19"),  # loose form still counts for correctness
        ("answer = 8", "8"),
        ("so we get \\boxed{\\frac{3}{4}} as the result", "\\frac{3}{4}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{6}\nAnswer: 5", "5"),  # the answer line beats \boxed
        ("I think it is 12.", None),
        ("Answer:", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_strict_extraction_and_answer_line() -> None:
    assert extract_answer("**Answer:** 19", strict=True) is None
    assert extract_answer("\\boxed{3}", strict=True) is None
    assert extract_answer("work\nAnswer: 19", strict=True) == "19"
    assert has_answer_line("x\nAnswer: 19\n")
    assert not has_answer_line("answer: 19")
    assert not has_answer_line("The Answer: 19")  # must start the line
    assert not has_answer_line("Answer:   ")
    assert "'Answer: <number>'" in answer_instruction()


def test_normalize_answer() -> None:
    assert normalize_answer("12.0") == normalize_answer("12") == "12"
    assert normalize_answer("1,000") == "1000"
    assert normalize_answer("-0.50") == "-0.5"
    assert normalize_answer(" The  Cat. ") == "the cat"


def test_exact_match_values() -> None:
    g = ExactMatchGrader()
    right = _grade(g, "Answer: 12.0", "12")
    assert (right.value, right.status, dict(right.components)) == (1.0, "ok", {"correct": 1.0})
    assert right.provenance["grader"] == "exact_match" and right.provenance["version"]
    wrong = _grade(g, "Answer: 13", "12")
    assert (wrong.value, wrong.status) == (0.0, "ok")
    none = _grade(g, "no idea", "12")  # no answer is a valid 0, not a failure
    assert (none.value, none.status) == (0.0, "ok")
    missing_ref = _grade(g, "Answer: 12", None)
    assert (missing_ref.value, missing_ref.status) == (None, "invalid")


def test_format_grader_values() -> None:
    g = FormatGrader(penalty=0.3)
    present = _grade(g, "work\nAnswer: 12", "12")
    assert (present.value, dict(present.components)) == (0.0, {"format": 1.0})
    absent = _grade(g, "the answer is \\boxed{12}", "12")
    assert (absent.value, dict(absent.components)) == (-0.3, {"format": 0.0})
    assert absent.status == "ok" and absent.provenance["penalty"] == 0.3
    with pytest.raises(ValueError):
        FormatGrader(penalty=-1)


def test_math_verify_plain_numbers_need_no_worker() -> None:
    pool = IsolatedPool(1)
    g = MathVerifyGrader(pool=pool)
    assert _grade(g, "Answer: 12.0", "12").value == 1.0
    assert _grade(g, "Answer: 13", "12").value == 0.0
    assert pool.pids == []  # decided in-process
    pool.close()


@pytest.mark.slow  # a math-verify worker process
@pytest.mark.parametrize(
    ("completion", "reference", "value"),
    [
        ("Answer: 0.5", "\\frac{1}{2}", 1.0),
        ("Answer: $\\frac{2}{4}$", "0.5", 1.0),
        ("Answer: 1/2", "\\frac{1}{2}", 1.0),
        ("Answer: $2\\sqrt{2}$", "\\sqrt{8}", 1.0),
        ("final: \\boxed{\\dfrac{3}{4}}", "0.75", 1.0),
        ("Answer: 12 apples", "12", 1.0),
        ("Answer: \\frac{1}{3}", "\\frac{1}{2}", 0.0),
        ("Answer: banana", "\\frac{1}{2}", 0.0),
        ("no answer here", "\\frac{1}{2}", 0.0),
    ],
)
def test_math_verify_equivalence(mv_pool, completion: str, reference: str, value: float) -> None:
    score = _grade(MathVerifyGrader(pool=mv_pool), completion, reference)
    assert (score.value, score.status) == (value, "ok")
    assert score.components == {"correct": value}
    assert score.provenance["grader"] == "math_verify"


@pytest.mark.slow  # a math-verify worker process
def test_math_verify_unparseable_reference_is_invalid(mv_pool) -> None:
    score = _grade(MathVerifyGrader(pool=mv_pool), "Answer: 2", "")
    assert (score.value, score.status) == (None, "invalid")
    score = _grade(MathVerifyGrader(pool=mv_pool), "Answer: x+1", "\\")
    assert (score.value, score.status) == (None, "invalid")
    assert "could not be parsed" in score.explanation


def test_math_verify_default_shared_pool() -> None:
    assert _grade(MathVerifyGrader(), "Answer: \\frac{6}{4}", "1.5").value == 1.0


@pytest.fixture
def bad_compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module of misbehaving compare functions, importable by worker children."""
    (tmp_path / "rldojo_test_bad_compare.py").write_text(
        textwrap.dedent(
            """
            import os, time

            def hang(reference, answer):
                time.sleep(3600)

            def crash(reference, answer):
                os._exit(7)

            def equal(reference, answer):
                return reference == answer
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # before the pool starts: children copy sys.path
    return importlib.import_module("rldojo_test_bad_compare")


@pytest.mark.slow  # a math-verify worker process
def test_math_verify_hang_is_timeout_not_zero(bad_compare) -> None:
    with IsolatedPool(1) as pool:
        g = MathVerifyGrader(timeout_s=0.5, pool=pool, compare=bad_compare.hang)
        asyncio.run(pool.call(bad_compare.equal, "a", "a", timeout_s=30))  # started and warm
        start = time.monotonic()
        score = _grade(g, "Answer: \\frac{1}{2}", "0.5")
        assert time.monotonic() - start < 60  # the timeout, not the hour-long call, ended it
        assert (score.value, score.status) == (None, "timeout")
        assert "0.5s" in score.explanation


@pytest.mark.slow  # a math-verify worker process
def test_math_verify_crash_is_error_and_next_call_works(bad_compare) -> None:
    with IsolatedPool(1) as pool:
        crashing = MathVerifyGrader(pool=pool, compare=bad_compare.crash)
        score = _grade(crashing, "Answer: x", "y")
        assert (score.value, score.status) == (None, "error")
        assert "exited with code 7" in score.explanation
        working = MathVerifyGrader(pool=pool, compare=bad_compare.equal)
        assert _grade(working, "Answer: x", "x").value == 1.0


def test_math_verify_closed_pool_is_error() -> None:
    pool = IsolatedPool(1)
    pool.close()
    score = _grade(MathVerifyGrader(pool=pool), "Answer: x", "y")
    assert (score.value, score.status) == (None, "error")
