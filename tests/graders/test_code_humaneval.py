"""All 164 HumanEval canonical solutions score 1.0; a `return None` body scores 0."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from rldojo.graders.code.grader import (
    CodeGradingConfig,
    CodeTestsGrader,
    check_solution,
    load_humaneval,
)
from rldojo.sandbox import SandboxPool, probe

pytestmark = pytest.mark.slow  # 164 solutions in the sandbox


@pytest.mark.timeout(180)
def test_humaneval_canonical_and_wrong_solutions() -> None:
    if not probe().strict:
        if os.environ.get("CI") == "true":
            pytest.fail("CI requires the strict sandbox:\n" + probe().summary)
        pytest.skip("strict sandbox unavailable:\n" + probe().summary)
    problems = load_humaneval()
    assert len(problems) == 164
    with SandboxPool(2) as pool:
        # 10 s a test: the limit covers fork, seccomp and import on a loaded machine too.
        grader = CodeTestsGrader(CodeGradingConfig(test_timeout_s=10.0), pool=pool)

        def both(row: dict) -> tuple[str, float | None, float | None]:
            good = check_solution(row, row["canonical_solution"], grader=grader)
            bad = check_solution(row, "    return None\n", grader=grader)
            return row["task_id"], good.value, bad.value

        with ThreadPoolExecutor(2) as threads:
            results = list(threads.map(both, problems))
    wrong = [(tid, good, bad) for tid, good, bad in results if good != 1.0 or bad != 0.0]
    assert wrong == []
