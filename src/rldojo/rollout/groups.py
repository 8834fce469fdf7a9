"""Groups of graded rollouts: what a rollout source yields and the trainer learns from.

A `Group` is the G rollouts of one task with their scores and ledger ids. A sample is
*valid* when its rollout is trainable and its score is `ok`; failed samples are excluded
from the group (not counted as reward 0). A group is *informative* when at least two
valid samples have different rewards, or a valid sample carries nonzero token rewards
(`Score.token_rewards`) — otherwise every advantage is 0 and it carries no signal and is
never trained (whether or not `rollout.dynamic_sampling` refills it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rldojo.types import Rollout, Score, Task

__all__ = ["Collected", "Group", "make_groups", "oversampled", "requests"]


@dataclass
class Group:
    task: Task
    rollouts: list[Rollout]
    scores: list[Score]
    ledger_ids: list[int]
    valid: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        self.valid = [r.trainable and s.ok for r, s in zip(self.rollouts, self.scores, strict=True)]

    @property
    def rewards(self) -> list[float]:
        return [
            float(s.value)
            for s, ok in zip(self.scores, self.valid, strict=True)
            if ok and s.value is not None
        ]

    @property
    def informative(self) -> bool:
        rewards = self.rewards
        if len(rewards) < 2:
            return False
        if max(rewards) > min(rewards):
            return True
        return any(  # token rewards (e.g. per-move credit) are signal of their own
            ok and s.token_rewards and any(s.token_rewards)
            for s, ok in zip(self.scores, self.valid, strict=True)
        )


@dataclass
class Collected:
    """One step's worth of groups from a source, with every rollout drawn for it."""

    groups: list[Group]
    timing: dict[str, float]
    """Phase times (`time/generate`, `time/grade`, ...) and source counters."""
    rounds: int
    """Extra rounds drawn to refill groups without signal (dynamic sampling)."""
    task_metrics: dict[str, float] = field(default_factory=dict)
    """The task sampler's metrics (the curriculum's), taken by the thread that drew and
    observed these groups right after it did: the trainer logs this snapshot instead of
    reading the sampler, which an asynchronous producer may be changing meanwhile."""

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def scores(self) -> list[Score]:
        return [s for g in self.groups for s in g.scores]

    def informative(self) -> int:
        return sum(g.informative for g in self.groups)


def requests(tasks: Sequence[Task], group_size: int, seed: int) -> list[tuple[Task, int, int]]:
    """G `(task, sample_index, seed)` requests per task, task i seeded `seed + i`."""
    return [(t, k, seed + i) for i, t in enumerate(tasks) for k in range(group_size)]


def make_groups(
    tasks: Sequence[Task],
    rollouts: Sequence[Rollout],
    scores: Sequence[Score],
    ids: Sequence[int],
    group_size: int,
) -> list[Group]:
    """Task i's group is rollouts `[i*G, (i+1)*G)` (the order `requests` made)."""
    g = group_size
    return [
        Group(
            tasks[i],
            list(rollouts[i * g : (i + 1) * g]),
            list(scores[i * g : (i + 1) * g]),
            list(ids[i * g : (i + 1) * g]),
        )
        for i in range(len(tasks))
    ]


def oversampled(need: int, factor: float) -> int:
    """How many tasks to draw for `need` informative groups (`rollout.oversample`)."""
    return math.ceil(need * factor - 1e-9)
