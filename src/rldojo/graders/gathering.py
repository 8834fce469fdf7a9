"""Per-sample grading calls gathered into group calls.

The rollout engine grades one rollout at a time (`Grader.grade`). A grader that scores
the samples of a task together (a group judge, a batched reward function) hands each
call to a `GroupGathering`, which holds it until the rest of its group has arrived (same
task id, seed and policy version: the G samples of one prompt in a step) and then makes
one group call. It fires when `group_size` samples are in, or `window_s` after the last
one arrived: in an evaluation a task has one sample, and a group larger than
`rollout.grade_concurrency` arrives in parts. So the window only ever delays a grade;
which samples share a call never changes a sample's score unless the grader compares
them (a group judge does, by design).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rldojo.types import Rollout, Score, Task

__all__ = ["GradeGroup", "GroupGathering"]

GradeGroup = Callable[[Sequence[Rollout], Task], Awaitable[list[Score]]]
"""`grade_group(rollouts, task)`: one score per rollout, in order."""

_Key = tuple[int, str, int, int]


@dataclass
class _Gathering:
    task: Task
    members: list[tuple[Rollout, asyncio.Future[Score]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class GroupGathering:
    """Turns per-sample `grade` calls into `grade_group` calls (see the module docstring);
    `name` names the grader in the failure a raising `grade_group` becomes."""

    def __init__(
        self,
        grade_group: GradeGroup,
        *,
        name: str,
        group_size: int | None = None,
        window_s: float = 0.25,
    ) -> None:
        self.grade_group, self.name = grade_group, name
        self.group_size, self.window_s = group_size, window_s
        self._gathering: dict[_Key, _Gathering] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        """This sample's score, once its group has been graded."""
        loop = asyncio.get_running_loop()
        key = (id(loop), task.id, rollout.seed, rollout.policy_version)
        gathering = self._gathering.setdefault(key, _Gathering(task))
        future: asyncio.Future[Score] = loop.create_future()
        gathering.members.append((rollout, future))
        if gathering.timer is not None:
            gathering.timer.cancel()
        if self.group_size is not None and len(gathering.members) >= self.group_size:
            self._fire(key)
        else:
            gathering.timer = loop.call_later(self.window_s, self._fire, key)
        return await future

    def _fire(self, key: _Key) -> None:
        gathering = self._gathering.pop(key, None)
        if gathering is None:
            return
        if gathering.timer is not None:
            gathering.timer.cancel()
        job = asyncio.ensure_future(self._grade_gathered(gathering))
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    async def _grade_gathered(self, gathering: _Gathering) -> None:
        members = sorted(gathering.members, key=lambda m: m[0].sample_index)
        try:
            scores = await self.grade_group([r for r, _ in members], gathering.task)
        except Exception as exc:  # a bug here must not leave the trainer waiting
            why = f"{self.name} raised {type(exc).__name__}: {exc}"
            scores = [Score.failed("error", why) for _ in members]
        for (_, future), score in zip(members, scores, strict=True):
            if not future.done():
                future.set_result(score)
