"""Visible-test feedback of code-repair-v1: run an attempt, describe what failed.

`check_attempt` runs one attempt against a task's *visible* tests in the sandbox (never
the held-out ones; only inputs enter the sandbox, expected outputs are compared here) and
returns a `VisibleCheck`; `feedback_message` turns a failed check into the next user
message (call, expected value, what came back or the error, truncated). A sandbox failure
raises `FeedbackError`, which the rollout engine records as the status ``env_error``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rldojo.graders.code.cases import IOTest, TestCase, convert_asserts, parse_test
from rldojo.graders.code.grader import (
    CodeTestsGrader,
    Suite,
    driver_spec,
    extract_code,
    suite_from_info,
)
from rldojo.graders.code.scoring import CANARY_PREFIX, DriverError, Outcome, parse_outcome, passed
from rldojo.types import Task

__all__ = [
    "FeedbackError",
    "VisibleCheck",
    "check_attempt",
    "feedback_message",
    "visible_tests",
]

REPAIR_INSTRUCTION = "Fix the code and reply with the complete corrected code in a ```python block."
_SHORT = 160
"""Characters of one value (call, expected, got) shown in feedback."""


class FeedbackError(RuntimeError):
    """The sandbox could not run the visible tests (the episode fails; it is never a 0)."""


@dataclass(frozen=True)
class VisibleCheck:
    """An attempt against the visible tests: counts and one line per failed test."""

    passed: int
    total: int
    failures: tuple[str, ...] = ()
    detailed: bool = True
    """False when the suite has no input/expected pairs to show (counts only)."""

    @property
    def all_passed(self) -> bool:
        return self.passed == self.total


def visible_tests(info: Mapping[str, Any]) -> list[TestCase] | None:
    """The tests whose failures may be shown: ``info["tests"]`` (never the held-out ones);
    for an assert suite, the first half of its asserts; None when a suite has no plain
    input/expected pairs (then only counts are shown)."""
    if info.get("tests"):
        return [parse_test(t, held_out=False) for t in info["tests"]]
    if info.get("test"):
        converted = convert_asserts(str(info["test"]), str(info.get("entry_point", "")))
        if converted:
            return list(converted[: max(1, len(converted) // 2)])
    return None


def _short(text: str, limit: int = _SHORT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _got(out: Outcome) -> str:
    if out.timeout:
        return "a timeout"
    if out.error:
        return f"an error ({_short(out.error, 100)})"
    if out.stdout is not None:
        return _short(repr(out.stdout))
    return _short(repr(out.value)) if out.has_value else "no result"


def describe_failure(entry_point: str, test: TestCase, out: Outcome) -> str:
    """One feedback line: what was run, what was expected, what came back."""
    if isinstance(test, IOTest):
        return (
            f"input {_short(repr(test.stdin))}: expected output {_short(repr(test.stdout))}, "
            f"got {_got(out)}"
        )
    args = [repr(a) for a in test.args] + [f"{k}={v!r}" for k, v in test.kwargs.items()]
    call = f"{entry_point}({', '.join(args)})"
    if test.wrap:
        call = f"{test.wrap}({call})"
    expected = {
        "truthy": "True",
        "falsy": "False",
        "close": f"{test.expected!r} (within {test.tol:g})",
    }.get(test.compare, repr(test.expected))
    return f"{_short(call)} should return {_short(expected)}, got {_got(out)}"


async def _run_visible(
    grader: CodeTestsGrader, code: str, entry_point: str, tests: Sequence[TestCase]
) -> VisibleCheck:
    cfg = replace(grader.config, decoys=False)  # only the final grade needs the decoys
    canary = CANARY_PREFIX + os.urandom(6).hex()
    spec = driver_spec(code, Suite(entry_point, tuple(tests)), list(tests), cfg, canary)
    result = await grader.pool.execute_async(spec)
    if result.status == "sandbox_error":
        raise FeedbackError(f"sandbox error after {result.attempts} attempts: {result.error}")
    if not any(r.get("k") == "done" for r in result.records):
        raise FeedbackError(f"visible-test run did not finish ({result.status})")
    records = {r["i"]: r for r in result.records if r.get("k") == "test"}
    failures = []
    for i, test in enumerate(tests):
        try:
            out = (
                parse_outcome(records[i], spec.job["mode"])
                if i in records
                else Outcome(timeout=True, error="not run")
            )
        except DriverError as exc:
            raise FeedbackError(str(exc)) from None
        if not passed(test, out):
            failures.append(describe_failure(entry_point, test, out))
    return VisibleCheck(len(tests) - len(failures), len(tests), tuple(failures))


async def check_attempt(grader: CodeTestsGrader, completion: str, task: Task) -> VisibleCheck:
    """Run one attempt against the task's visible tests in the sandbox.

    Only inputs enter the sandbox; expected outputs are compared here. Raises
    `FeedbackError` when the sandbox fails.
    """
    info = task.info
    entry = str(info.get("entry_point", ""))
    completion = completion.encode("utf-8", "replace").decode("utf-8")  # lone surrogates
    code = str(info.get("code_prefix", "")) + extract_code(completion, entry or None)
    tests = visible_tests(info)
    if tests is not None:
        return await _run_visible(grader, code, entry, tests)
    score = await asyncio.to_thread(grader.grade_code, code, suite_from_info(info))
    if not score.ok:
        raise FeedbackError(f"grading the attempt failed ({score.status}): {score.explanation}")
    n_pass, total = int(score.components["tests/passed"]), int(score.components["tests/total"])
    return VisibleCheck(n_pass, total, detailed=False)


def feedback_message(check: VisibleCheck, max_shown: int = 3) -> str:
    """The user message after a failed attempt."""
    if not check.detailed:
        return f"Your code passed {check.passed} of {check.total} tests.\n{REPAIR_INSTRUCTION}"
    n_fail = check.total - check.passed
    lines = [f"Your code failed {n_fail} of {check.total} visible tests:"]
    lines += [f"- {line}" for line in check.failures[:max_shown]]
    if n_fail > max_shown:
        lines.append(f"- ... and {n_fail - max_shown} more")
    lines.append(REPAIR_INSTRUCTION)
    return "\n".join(lines)
