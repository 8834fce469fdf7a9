"""Which tasks are rolled out next: the environment mixture, thinned by the curriculum.

`TaskSampler` is what every rollout source draws from and reports back to: `draw(n)`
gives the next training tasks, `observe(groups)` tells the curriculum how each task's
group went (so it learns on every source — synchronous, asynchronous or Ray), and
`state_dict()` is the draw position a checkpoint saves.

A sampler is not thread-safe and has one owner: the thread that draws and observes. Its
`metrics()` and `state_dict()` iterate what `observe` changes, so they are called by that
thread too; the rollout sources take both after each batch and hand them to the trainer
with the groups (`rldojo.rollout.sources`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rldojo.data.curriculum import Curriculum
from rldojo.rollout.groups import Group
from rldojo.rollout.mixture import EnvMixture
from rldojo.types import Task

__all__ = ["TaskSampler"]


class TaskSampler:
    """Draws from `mixture`; with a `curriculum` (`rldojo.data.curriculum.Curriculum`),
    saturated tasks are drawn less (rejection sampling keeps the mixture's order)."""

    def __init__(self, mixture: EnvMixture, curriculum: Curriculum | None = None, *, seed: int = 0):
        self.mixture = mixture
        self.curriculum = curriculum
        self.seed = seed

    def draw(self, n: int) -> list[Task]:
        """The next `n` training tasks."""
        if self.curriculum is None:
            return self.mixture.draw(n)
        rng = random.Random(f"{self.seed}:curriculum:{self.mixture.draws}")
        return list(self.curriculum.draw(self.mixture.draw, n, rng))

    def observe(self, groups: Sequence[Group]) -> None:
        """Each group's valid rewards, for the curriculum (nothing without one)."""
        if self.curriculum is not None:
            for g in groups:
                self.curriculum.observe(g.task.id, g.rewards)

    def metrics(self) -> dict[str, float]:
        """The curriculum's counts and pass rates (a new dict; empty without one)."""
        return {} if self.curriculum is None else dict(self.curriculum.metrics())

    def state_dict(self) -> dict[str, Any]:
        """Where the draws stand (environments' cursors, curriculum), JSON-able."""
        return {
            "tasks": self.mixture.state_dict(),
            "curriculum": None if self.curriculum is None else self.curriculum.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mixture.load_state_dict(state["tasks"])
        if self.curriculum is not None and state.get("curriculum"):
            self.curriculum.load_state_dict(state["curriculum"])
