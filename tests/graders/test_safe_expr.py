"""The calculate_output evaluator: grammar, precedence, functions, and refusals."""

from __future__ import annotations

import math

import pytest

from rldojo.graders.safe_expr import ExprError, compile_expr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ^ 3 ^ 2", 512.0),  # right-associative
        ("2 ** 3", 8.0),
        ("-2 ^ 2", -4.0),  # unary minus binds looser than ^
        ("2 * -3", -6.0),
        ("10 / 4 - 1", 1.5),
        (".5 + 1e1", 10.5),
        ("min(3, 1, 2) + max(0.25, 0.5)", 1.5),
        ("abs(-2) + floor(1.7) + ceil(1.2)", 5.0),
        ("sqrt(16) + log(exp(2))", 6.0),
    ],
)
def test_arithmetic(text, expected):
    assert compile_expr(text).evaluate({}) == pytest.approx(expected)


def test_names_are_grader_values():
    expr = compile_expr("0.7 * exact + 0.3 * fuzzy ^ 2", {"exact", "fuzzy"})
    assert expr.names == {"exact", "fuzzy"}
    # 0.7 * 1 + 0.3 * 0.5^2 = 0.7 + 0.075
    assert expr.evaluate({"exact": 1.0, "fuzzy": 0.5}) == pytest.approx(0.775)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 +", "end of expression"),
        ("(1 + 2", r"expected '\)'"),
        ("1 2", "unexpected '2' at column 3"),
        ("1 $ 2", "unexpected character '\\$' at column 3"),
        ("__import__(os)", "unknown function '__import__'"),
        ("a.b", "unexpected character '\\.'"),
        ("max()", "unexpected"),
        ("sqrt(1, 2)", "takes 1 argument"),
        ("", "empty"),
        ("unknown + 1", "unknown name 'unknown'"),
    ],
)
def test_malformed_expressions_name_the_problem(text, message):
    with pytest.raises(ExprError, match=message):
        compile_expr(text, {"a"}).evaluate({"a": 1.0})


@pytest.mark.parametrize(
    "text", ["1 / 0", "sqrt(-1)", "log(0)", "10 ^ 400", "(-8) ^ (1/3)", "exp(1000)"]
)
def test_undefined_results_raise_instead_of_inf_or_nan(text):
    with pytest.raises(ExprError):
        compile_expr(text).evaluate({})


def test_size_and_depth_are_bounded():
    with pytest.raises(ExprError, match="longer than"):
        compile_expr("1+" * 1500 + "1")
    with pytest.raises(ExprError, match="deeper"):
        compile_expr("(" * 60 + "1" + ")" * 60)
    assert math.isfinite(compile_expr("(" * 20 + "1" + ")" * 20).evaluate({}))


def test_missing_value_is_an_error():
    with pytest.raises(ExprError, match="no value"):
        compile_expr("a + b").evaluate({"a": 1.0})
