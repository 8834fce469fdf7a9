"""`Group`: which samples are valid and when a group carries learning signal."""

from __future__ import annotations

from rldojo.rollout.groups import Group
from rldojo.types import Rollout, Score, Task

TASK = Task(id="t", prompt="flip", env="coin-v1")


def _group(scores: list[Score]) -> Group:
    rollouts = [
        Rollout("t", "coin-v1", [], "x", completion_ids=(1, 2), policy_mask=(True, True))
        for _ in scores
    ]
    return Group(TASK, rollouts, scores, list(range(len(scores))))


def test_failed_scores_are_excluded_not_zero():
    scores = [
        Score(value=1.0),
        Score.failed("timeout", "slow"),
        Score(value=1.0),
        Score.failed("error", "boom"),
    ]
    group = _group(scores)
    # Two valid samples with equal reward: no signal. Were failures counted as 0 the
    # group would look informative and push the policy away from good samples.
    assert group.valid == [True, False, True, False]
    assert not group.informative
    # Equal rewards but token rewards on a valid sample (per-move credit): signal.
    # On a failed sample they are not.
    scores[3] = Score(value=None, status="error", token_rewards=(0.0, -0.5))
    assert not _group(scores).informative
    scores[0] = Score(value=1.0, token_rewards=(0.0, 0.0))
    assert not _group(scores).informative
    scores[0] = Score(value=1.0, token_rewards=(0.0, -0.5))
    assert _group(scores).informative
    scores[0] = Score(value=1.0)
    scores[2] = Score(value=0.0)
    assert _group(scores).informative


def test_a_rollout_that_cannot_train_is_not_valid():
    """An errored rollout, or one without a policy token, is excluded like a failed score."""
    group = _group([Score(value=1.0), Score(value=0.0)])
    errored = Rollout("t", "coin-v1", [], "", completion_ids=(1,), policy_mask=(True,),
                      status="env_error")  # fmt: skip
    no_policy = Rollout("t", "coin-v1", [], "", completion_ids=(1,), policy_mask=(False,))
    for bad in (errored, no_policy):
        mixed = Group(TASK, [group.rollouts[0], bad], group.scores, [0, 1])
        assert mixed.valid == [True, False] and not mixed.informative
