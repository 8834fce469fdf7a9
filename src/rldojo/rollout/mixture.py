"""Environment mixtures: one run draws tasks from several environments by weight.

`EnvMixture` holds, per environment, a factory, its grader and its train/test tasks. Task
draws are deterministic: the environment of draw `i` comes from its own seeded RNG
(`Random(f"{seed}:mix:{i}")`) and each environment walks its train tasks in an order
reshuffled every epoch, so `state_dict()` (draw count, cursors, epochs) is all a resumed
run needs to continue the same data order. `MixtureGrader` dispatches each rollout to the
grader of its task's environment, so every environment keeps its own grader config.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rldojo.envs.base import BoundedEnv, Env
from rldojo.envs.registry import EnvKwargsError, make_env
from rldojo.graders.base import Grader, close_grader, self_timed
from rldojo.types import Rollout, Score, Task


@dataclass
class EnvSlot:
    env_id: str
    kwargs: dict[str, Any]
    weight: float
    grader: Grader
    train_tasks: list[Task]
    test_tasks: list[Task]
    order: list[int] = field(default_factory=list)
    cursor: int = 0
    epoch: int = 0
    max_at_once: tuple[int, str] | None = None
    """The environment's `max_episodes_at_once` and the kwarg that sets it (None: no limit)."""

    def make(self) -> Env:
        return make_env(self.env_id, **self.kwargs)


def _tag(tasks: Sequence[Task], env_id: str) -> list[Task]:
    """Tasks remember their environment (so rollouts and graders can be routed)."""
    return [t if t.env == env_id else replace(t, env=env_id) for t in tasks]


def _make(env_id: str, kwargs: Mapping[str, Any]) -> Env:
    """Build an environment; a factory that rejects its kwargs (a ValueError or TypeError
    other than a data file's `DataError`) is a one-line config error, not a traceback."""
    from rldojo.data.loading import DataError

    try:
        return make_env(env_id, **kwargs)
    except (DataError, EnvKwargsError):
        raise
    except (ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        raise EnvKwargsError(f"env.kwargs: {env_id}: {message}") from exc


class EnvMixture:
    """Weighted environments with deterministic, resumable task draws."""

    def __init__(
        self,
        entries: Sequence[tuple[str, Mapping[str, Any], float]],
        *,
        seed: int,
        train_n: int | None,
        test_n: int,
        grader: Grader | None = None,
    ) -> None:
        if not entries:
            raise ValueError("an environment mixture needs at least one environment")
        self.seed = seed
        self.draws = 0
        self.slots: dict[str, EnvSlot] = {}
        total = sum(w for _, _, w in entries)
        for env_id, kwargs, weight in entries:
            env = _make(env_id, kwargs)
            n_test = max(1, round(test_n * weight / total)) if test_n else 1
            slot = EnvSlot(
                env_id,
                dict(kwargs),
                weight,
                grader if grader is not None else env.default_grader(),
                _tag(env.tasks("train", seed=seed, n=train_n), env_id),
                _tag(env.tasks("test", seed=seed, n=n_test), env_id)[:n_test] if test_n else [],
            )
            slot.order = self._order(slot)
            if isinstance(env, BoundedEnv):
                slot.max_at_once = (env.max_episodes_at_once, env.max_episodes_at_once_key)
            self.slots[env_id] = slot

    def _order(self, slot: EnvSlot) -> list[int]:
        order = list(range(len(slot.train_tasks)))
        random.Random(f"{self.seed}:{slot.env_id}:{slot.epoch}").shuffle(order)
        return order

    @property
    def test_tasks(self) -> list[Task]:
        return [t for slot in self.slots.values() for t in slot.test_tasks]

    def slot_for(self, task: Task) -> EnvSlot:
        return self.slots.get(task.env) or next(iter(self.slots.values()))

    def make_env_for(self, task: Task) -> Env:
        return self.slot_for(task).make()

    def factory(self) -> Callable[[Task], Env]:
        return self.make_env_for

    def draw(self, n: int) -> list[Task]:
        """The next `n` training tasks across environments, by weight."""
        ids = list(self.slots)
        weights = [self.slots[i].weight for i in ids]
        out = []
        for _ in range(n):
            env_id = ids[0]
            if len(ids) > 1:
                env_id = random.Random(f"{self.seed}:mix:{self.draws}").choices(ids, weights)[0]
            self.draws += 1
            out.append(self._next(self.slots[env_id]))
        return out

    def _next(self, slot: EnvSlot) -> Task:
        if slot.cursor >= len(slot.order):
            slot.epoch, slot.cursor = slot.epoch + 1, 0
            slot.order = self._order(slot)
        task = slot.train_tasks[slot.order[slot.cursor]]
        slot.cursor += 1
        return task

    def state_dict(self) -> dict[str, Any]:
        return {
            "draws": self.draws,
            "slots": {k: {"cursor": s.cursor, "epoch": s.epoch} for k, s in self.slots.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.draws = int(state["draws"])
        for env_id, st in state["slots"].items():
            slot = self.slots[env_id]
            slot.epoch, slot.cursor = int(st["epoch"]), int(st["cursor"])
            slot.order = self._order(slot)

    def grader(self) -> MixtureGrader:
        return MixtureGrader({k: s.grader for k, s in self.slots.items()})


class MixtureGrader:
    """Grades each rollout with the grader of its task's environment."""

    def __init__(self, graders: Mapping[str, Grader]) -> None:
        self.graders = dict(graders)
        self._default = next(iter(self.graders.values()))
        names = dict.fromkeys(g.name for g in self.graders.values())
        self.name = "+".join(names)  # e.g. "math-verify+code-tests" (logs, provenance)
        self.enforces_timeouts = all(self_timed(g) for g in self.graders.values())

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        return await self.graders.get(task.env, self._default).grade(rollout, task)

    async def close(self) -> None:
        for grader in {id(g): g for g in self.graders.values()}.values():
            await close_grader(grader)
