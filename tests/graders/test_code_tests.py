"""Parsing test specs and converting assert suites (pure functions, no sandbox)."""

from __future__ import annotations

import pytest

from rldojo.graders.code.cases import (
    CallTest,
    IOTest,
    TestSpecError,
    check_call,
    check_io,
    convert_asserts,
)
from rldojo.graders.code.grader import extract_code, suite_from_info

SUITE = '''
METADATA = {"author": "x"}

def check(candidate):
    """docstring"""
    assert candidate([1, 2], 3 * 2) == [1, 2] + [6]
    assert abs(candidate(1.5) - 2.0 / 3.0) < 1e-6
    assert candidate("a") is None
    assert candidate(0)
    assert not candidate(1)
    assert tuple(candidate([3, 1])) == tuple([1, 3])
    assert candidate(k=2) == {"a": (1, 2)}, "message"
    assert True
    print("done")
'''


def test_convert_simple_asserts() -> None:
    tests = convert_asserts(SUITE, "f")
    assert tests is not None
    assert [t.compare for t in tests] == ["eq", "close", "is", "truthy", "falsy", "eq", "eq"]
    assert tests[0] == CallTest(args=([1, 2], 6), expected=[1, 2, 6])
    assert tests[1].expected == pytest.approx(2 / 3) and tests[1].tol == 1e-6
    assert tests[5].wrap == "tuple" and tests[5].expected == (1, 3)
    assert tests[6].kwargs == {"k": 2}


@pytest.mark.parametrize(
    "body",
    [
        "for x in range(3):\n        assert candidate(x) == x",
        "assert candidate(1) == helper(1)",
        "y = candidate(1)\n    assert y == 2",
        "assert candidate(2 ** 100000) == 1",
    ],
)
def test_non_constant_suites_need_replay(body: str) -> None:
    assert convert_asserts(f"def check(candidate):\n    {body}\n", "f") is None


def test_top_level_asserts_on_the_entry_point() -> None:
    tests = convert_asserts("assert add(1, 2) == 3\nassert add(2, 2) == 4\n", "add")
    assert tests is not None and [t.expected for t in tests] == [3, 4]


def test_check_call_is_type_strict() -> None:
    assert check_call(CallTest((1,), 3), 3)
    assert not check_call(CallTest((1,), 3), 3.0)
    assert not check_call(CallTest((1,), 1), True)
    assert not check_call(CallTest((1,), True, compare="truthy"), 1)
    assert check_call(CallTest((1,), 0.5, compare="close", tol=1e-6), 0.5000001)
    assert not check_call(CallTest((1,), 0.5, compare="close", tol=1e-6), float("nan"))
    assert check_call(CallTest((1,), (1, 2), wrap="tuple"), [1, 2])


def test_check_io_ignores_trailing_whitespace() -> None:
    assert check_io(IOTest("", "1 2\n3"), "1 2  \n3\n\n")
    assert not check_io(IOTest("", "1 2\n3"), "1 2 3\n")


def test_suite_from_info_validates() -> None:
    with pytest.raises(TestSpecError):
        suite_from_info({"entry_point": "f"})
    with pytest.raises(TestSpecError):
        suite_from_info({"tests": [{"input": [1], "output": 2}]})
    with pytest.raises(TestSpecError):
        suite_from_info({"entry_point": "f", "tests": [{"stdin": "", "stdout": ""},
                                                        {"input": [1], "output": 1}]})  # fmt: skip
    suite = suite_from_info(
        {
            "entry_point": "f",
            "tests": [{"input": [1], "output": 2}],
            "held_out_tests": [{"input": 5, "output": 6}],
        }
    )
    assert [t.held_out for t in suite.tests] == [False, True]
    assert suite.tests[1] == CallTest((5,), 6, held_out=True)


def test_extract_code() -> None:
    text = "Here:\n```python\ndef g():\n    pass\n```\nand\n```py\ndef f(x):\n    return x\n```\n"
    assert extract_code(text, "f") == "def f(x):\n    return x\n"
    assert extract_code(text, "h") == "def f(x):\n    return x\n"
    assert extract_code("def f(x): return x", "f") == "def f(x): return x"
