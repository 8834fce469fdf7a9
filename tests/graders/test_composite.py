"""CompositeGrader: weighted sums, merged components and flags, failure propagation."""

from __future__ import annotations

import asyncio

import pytest

from rldojo.graders.base import Grader
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader, answer_reward
from rldojo.graders.rules import ExactMatchGrader
from rldojo.types import Rollout, Score, Task

TASK = Task(id="t", prompt="What is 7 + 5?", answer="12")


class Fixed:
    """A grader that returns a fixed score (or raises)."""

    def __init__(self, score: Score | Exception, name: str = "fixed") -> None:
        self.score = score
        self.name = name

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        if isinstance(self.score, Exception):
            raise self.score
        return self.score


def _grade(grader: Grader, text: str = "Answer: 12") -> Score:
    rollout = Rollout(task_id="t", env="test", messages=[], completion=text)
    return asyncio.run(grader.grade(rollout, TASK))


def test_weighted_sum_components_and_flags() -> None:
    g = CompositeGrader(
        {
            "a": Fixed(Score(1.0, components={"correct": 1.0, "len": 3.0}, flags=("f1",))),
            "b": Fixed(Score(0.5, components={"correct": 0.0, "style": 0.5}, flags=("f2",))),
        },
        {"a": 2.0, "b": -1.0},
    )
    score = _grade(g)
    assert score.status == "ok"
    assert score.value == pytest.approx(2.0 * 1.0 - 1.0 * 0.5)
    # "correct" is reported by both sub-graders, so both get prefixed; the rest stay bare.
    assert dict(score.components) == {"a.correct": 1.0, "len": 3.0, "b.correct": 0.0, "style": 0.5}
    assert score.flags == ("f1", "f2")
    assert score.provenance["grader"] == "composite"
    assert score.provenance["weights"] == {"a": 2.0, "b": -1.0}


def test_weights_default_to_one_and_must_match() -> None:
    g = CompositeGrader({"a": Fixed(Score(0.25)), "b": Fixed(Score(0.5))})
    assert _grade(g).value == pytest.approx(0.75)
    with pytest.raises(ValueError, match="exactly"):
        CompositeGrader({"a": Fixed(Score(1.0))}, {"a": 1.0, "b": 1.0})
    with pytest.raises(ValueError, match="exactly"):
        CompositeGrader({"a": Fixed(Score(1.0)), "b": Fixed(Score(1.0))}, {"a": 1.0})
    with pytest.raises(ValueError):
        CompositeGrader({})


def test_failed_sub_grader_fails_the_composite_never_zero() -> None:
    g = CompositeGrader(
        {
            "correct": Fixed(Score.failed("timeout", "math-verify took too long", flags=("slow",))),
            "format": Fixed(Score(0.0, components={"format": 1.0})),
        }
    )
    score = _grade(g)
    assert (score.value, score.status) == (None, "timeout")
    assert "correct: timeout: math-verify took too long" in score.explanation
    assert score.flags == ("slow",)


def test_worst_status_wins_and_every_failure_is_named() -> None:
    g = CompositeGrader(
        {
            "a": Fixed(Score.failed("invalid", "no reference")),
            "b": Fixed(Score.failed("timeout", "slow")),
            "c": Fixed(Score.failed("error", "boom")),
            "d": Fixed(Score(1.0)),
        }
    )
    score = _grade(g)
    assert (score.value, score.status) == (None, "error")
    assert score.explanation.index("c: error") < score.explanation.index("b: timeout")
    assert "a: invalid: no reference" in score.explanation
    assert not score.explanation.startswith("d:") and "; d:" not in score.explanation


def test_sub_grader_that_raises_is_an_error() -> None:
    g = CompositeGrader({"a": Fixed(RuntimeError("kaput")), "b": Fixed(Score(1.0))})
    score = _grade(g)
    assert (score.value, score.status) == (None, "error")
    assert "a: error: raised RuntimeError: kaput" in score.explanation


@pytest.mark.parametrize(
    ("completion", "value", "components"),
    [
        ("7 + 5 = 12\nAnswer: 12", 1.0, {"correct": 1.0, "format": 1.0}),
        ("Answer: 13", 0.0, {"correct": 0.0, "format": 1.0}),
        ("It is \\boxed{12}", 1.0 - FORMAT_PENALTY, {"correct": 1.0, "format": 0.0}),
        ("I don't know", -FORMAT_PENALTY, {"correct": 0.0, "format": 0.0}),
    ],
)
def test_answer_reward(completion: str, value: float, components: dict[str, float]) -> None:
    score = _grade(answer_reward(ExactMatchGrader()), completion)
    assert score.status == "ok"
    assert score.value == pytest.approx(value)
    assert dict(score.components) == components
    assert score.provenance["grader"] == "answer_reward"


def test_answer_reward_penalty_is_configurable() -> None:
    assert FORMAT_PENALTY == 0.5
    grader = answer_reward(ExactMatchGrader(), format_penalty=0.2)
    assert _grade(grader, "nothing").value == pytest.approx(-0.2)
