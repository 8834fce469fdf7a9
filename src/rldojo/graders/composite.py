"""Composite graders: a weighted sum of named sub-graders, and the standard answer reward.

    CompositeGrader({"correct": MathVerifyGrader(), "format": FormatGrader(0.5)})

runs every sub-grader on the rollout (concurrently) and returns

    value = sum(weights[name] * sub_score.value)     (weights default to 1.0)

Components of the sub-scores are merged; a component name that more than one sub-grader
reports is prefixed with the sub-grader's name (``"correct.exact"``). Flags are
concatenated. If any sub-grader fails (status other than `ok`, or it raises), the
composite fails too — never a partial sum, never 0 — with the worst status
(`error` > `timeout` > `invalid`) and an explanation naming each failed sub-grader.

`answer_reward` builds the reward of the single-answer environments (arith-v1, math-v1):

    reward = correct - format_penalty * (1 - format)

i.e. 1.0 for a right answer on the ``Answer: ...`` line, 0.0 for a wrong one, and
``-format_penalty`` (default 0.5) when the answer line is missing, so that even a model
that is never right gets a signal towards the format it is graded on.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from typing import Any

from rldojo.graders.base import Grader
from rldojo.graders.rules import FormatGrader, MathVerifyGrader
from rldojo.types import Rollout, Score, ScoreStatus, Task

__all__ = ["FORMAT_PENALTY", "CompositeGrader", "answer_reward"]

FORMAT_PENALTY = 0.5
"""Default reward lost when the ``Answer: ...`` line is missing (see module docstring)."""

_SEVERITY: dict[ScoreStatus, int] = {"ok": 0, "invalid": 1, "timeout": 2, "error": 3}
"""Which failure the composite reports when several sub-graders fail.

`error` (a broken grader) outranks `timeout` (possibly transient), which outranks
`invalid` (the input cannot be graded), so infrastructure problems are never masked.
"""


class CompositeGrader:
    """Weighted sum of named sub-graders; fails when any of them fails.

    Args:
        graders: sub-graders by name (the names key `weights` and prefix components).
        weights: weight per sub-grader name; None gives 1.0 each. When given, its keys
            must be exactly the names in `graders`.
        name: this grader's name in provenance.
    """

    version = "1"

    def __init__(
        self,
        graders: Mapping[str, Grader],
        weights: Mapping[str, float] | None = None,
        *,
        name: str = "composite",
    ) -> None:
        if not graders:
            raise ValueError("CompositeGrader needs at least one sub-grader")
        self.graders = dict(graders)
        if weights is None:
            weights = {key: 1.0 for key in self.graders}
        if set(weights) != set(self.graders):
            raise ValueError(
                f"CompositeGrader weights {sorted(weights)} must name exactly the graders "
                f"{sorted(self.graders)}"
            )
        self.weights = {key: float(weights[key]) for key in self.graders}
        self.name = name

    @staticmethod
    async def _grade_one(grader: Grader, rollout: Rollout, task: Task) -> Score:
        try:
            return await grader.grade(rollout, task)
        except Exception as exc:  # a grader that raises is a failed grader, not a 0
            return Score.failed("error", f"raised {type(exc).__name__}: {exc}")

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        keys = list(self.graders)
        scores = dict(
            zip(
                keys,
                await asyncio.gather(
                    *(self._grade_one(self.graders[k], rollout, task) for k in keys)
                ),
                strict=True,
            )
        )
        provenance: dict[str, Any] = {
            "grader": self.name,
            "version": self.version,
            "weights": dict(self.weights),
            "parts": {k: dict(s.provenance) for k, s in scores.items()},
        }
        flags = tuple(flag for s in scores.values() for flag in s.flags)
        failed = [k for k in keys if not scores[k].ok]
        if failed:
            failed.sort(key=lambda k: -_SEVERITY[scores[k].status])
            worst = scores[failed[0]].status
            why = "; ".join(f"{k}: {scores[k].status}: {scores[k].explanation}" for k in failed)
            return Score.failed(worst, why, provenance=provenance, flags=flags)
        value = sum(self.weights[k] * float(scores[k].value or 0.0) for k in keys)
        return Score(
            value,
            components=_merge_components(scores),
            flags=flags,
            explanation="; ".join(
                f"{k}: {s.explanation}" for k, s in scores.items() if s.explanation
            ),
            provenance=provenance,
        )


def _merge_components(scores: Mapping[str, Score]) -> dict[str, float]:
    """Union of the sub-scores' components; names reported twice get a ``"<grader>."`` prefix."""
    counts = Counter(name for s in scores.values() for name in s.components)
    merged: dict[str, float] = {}
    for key, score in scores.items():
        for name, value in score.components.items():
            merged[name if counts[name] == 1 else f"{key}.{name}"] = float(value)
    return merged


def answer_reward(
    correct: Grader | None = None,
    *,
    format_penalty: float = FORMAT_PENALTY,
    timeout_s: float = 5.0,
) -> CompositeGrader:
    """``correct - format_penalty * (1 - format)`` (see the module docstring).

    `correct` defaults to `MathVerifyGrader(timeout_s=timeout_s)`.
    """
    if correct is None:
        correct = MathVerifyGrader(timeout_s=timeout_s)
    return CompositeGrader(
        {"correct": correct, "format": FormatGrader(penalty=format_penalty)},
        {"correct": 1.0, "format": 1.0},
        name="answer_reward",
    )
