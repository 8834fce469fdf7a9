"""`CodeTestsGrader` and `check_solution` on real sandboxes: test forms, credit, failures."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterator

import pytest

from rldojo.graders.base import Grader
from rldojo.graders.code.grader import (
    CodeGradingConfig,
    CodeTestsGrader,
    check_solution,
    load_humaneval,
)
from rldojo.sandbox import SandboxPool, probe
from rldojo.types import Rollout, Score, Task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the sandbox: processes
# Per-test limit: no test here is about timeouts, and on a loaded machine a test's child
# process (fork, seccomp, importing the solution) may take far longer than usual.
TEST_S = 10.0


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    if not probe().strict:
        if os.environ.get("CI") == "true":
            pytest.fail("CI requires the strict sandbox:\n" + probe().summary)
        pytest.skip("strict sandbox unavailable:\n" + probe().summary)
    with SandboxPool(2) as p:
        yield p


@pytest.fixture(scope="module")
def grader(pool: SandboxPool) -> CodeTestsGrader:
    return CodeTestsGrader(CodeGradingConfig(test_timeout_s=TEST_S), pool=pool)


def grade(grader: CodeTestsGrader, info: dict, completion: str) -> Score:
    task = Task(id="t", prompt="", info=info)
    rollout = Rollout(task_id="t", env="code-v1", messages=[], completion=completion)
    return asyncio.run(grader.grade(rollout, task))


def test_is_a_grader(grader: CodeTestsGrader) -> None:
    assert isinstance(grader, Grader)


STDIO = {
    "tests": [
        {"stdin": "2 3\n", "stdout": "5\n"},
        {"stdin": "10 -4\n", "stdout": "6"},
    ]
}


def test_stdin_stdout_program(grader: CodeTestsGrader) -> None:
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert grade(grader, STDIO, good).value == 1.0
    # Exiting early after the right output is fine for a program: only stdout counts.
    assert grade(grader, STDIO, good + "import sys\nsys.exit(3)\n").value == 1.0
    bad = grade(grader, STDIO, "print('All tests passed')\n")
    assert bad.value == 0.0 and "hack:success_marker" not in bad.flags


def test_stdin_program_reading_the_expected_output(grader: CodeTestsGrader) -> None:
    score = grade(grader, STDIO, "print(open('expected_output.txt').read())\n")
    assert score.value == 0.0 and "hack:test_read" in score.flags


def test_partial_credit(pool: SandboxPool) -> None:
    grader = CodeTestsGrader(
        CodeGradingConfig(partial_credit=True, test_timeout_s=TEST_S), pool=pool
    )
    info = {"entry_point": "f", "tests": [{"input": [i], "output": i * 2} for i in range(4)]}
    score = grade(grader, info, "def f(x):\n    return x * 2 if x < 2 else 0\n")
    assert score.value == 0.5 and score.components["tests/passed"] == 2.0


def test_assert_suite_in_task_info(grader: CodeTestsGrader) -> None:
    suite = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"
    info = {
        "entry_point": "inc",
        "test": suite,
    }
    assert grade(grader, info, "def inc(x):\n    return x + 1\n").value == 1.0
    assert grade(grader, info, "def inc(x):\n    return x\n").value == 0.0


REPLAY_INFO = {
    "entry_point": "double_all",
    "test_setup": "def make(n):\n    return list(range(n))\n",
    "test": (
        "import random\n"
        "def check(candidate):\n"
        "    for n in range(5):\n"
        "        xs = make(random.randint(0, 9))\n"
        "        assert candidate(xs) == [2 * x for x in xs]\n"
    ),
}


def test_replay_suite_with_loops_and_helpers(pool: SandboxPool) -> None:
    grader = CodeTestsGrader(
        CodeGradingConfig(partial_credit=True, test_timeout_s=TEST_S), pool=pool
    )
    good = grade(grader, REPLAY_INFO, "def double_all(xs):\n    return [2 * x for x in xs]\n")
    assert good.value == 1.0 and good.components["tests/total"] == 5.0
    bad = grade(grader, REPLAY_INFO, "def double_all(xs):\n    return xs\n")
    assert bad.ok and bad.value < 1.0  # an empty list doubles to itself


def test_fork_bomb_between_tests_does_not_break_grading(pool: SandboxPool) -> None:
    grader = CodeTestsGrader(CodeGradingConfig(allow_fork=True, test_timeout_s=TEST_S), pool=pool)
    info = {"entry_point": "f", "tests": [{"input": [i], "output": i} for i in range(3)]}
    code = (
        "import os\n"
        "def f(x):\n"
        "    for _ in range(200):\n"
        "        try:\n            os.fork()\n"
        "        except OSError:\n            break\n"
        "    return x\n"
    )
    score = grade(grader, info, code)
    assert score.ok and score.value == 1.0, score.explanation


def test_invalid_task_is_not_a_zero(grader: CodeTestsGrader) -> None:
    score = grade(grader, {"entry_point": "f"}, "def f(): pass")
    assert score.status == "invalid" and score.value is None


def test_sandbox_failure_is_an_error_not_a_zero(pool: SandboxPool) -> None:
    broken = SandboxPool(1, retries=1)
    broken.env = dataclasses.replace(broken.env, bwrap="/nonexistent/bwrap")
    try:
        grader = CodeTestsGrader(pool=broken)
        score = grade(grader, {"entry_point": "f", "tests": [{"input": [], "output": 1}]},
                      "def f():\n    return 1\n")  # fmt: skip
    finally:
        broken.close()
    assert score.status == "error" and score.value is None
    assert "sandbox error" in score.explanation


def test_check_solution_on_a_humaneval_row(grader: CodeTestsGrader) -> None:
    problems = load_humaneval()
    assert len(problems) == 164
    row = problems[0]
    assert check_solution(row, row["canonical_solution"], grader=grader).value == 1.0
    full = (
        "```python\nfrom typing import List\n\n" + row["prompt"].split("from typing import List")[1]
    )
    full += row["canonical_solution"] + "```"
    assert check_solution(row, full, grader=grader).value == 1.0
    assert check_solution(row, "    return None\n", grader=grader).value == 0.0
