"""Online curriculum: stop spending rollouts on tasks whose recent groups carried no signal.

A GRPO group whose samples are all correct or all wrong has zero advantage everywhere:
it costs a full group of rollouts and teaches nothing (DAPO's dynamic sampling drops such
groups after paying for them). The curriculum remembers each task's recent groups and
makes *saturated* tasks — the last `window` groups all-correct, or all-wrong — less
likely to be drawn again:

    mode "downweight": weight = saturated_weight (default 0.1), so they are revisited
                       now and then and come back to weight 1 once a group is mixed;
    mode "retire":     weight = 0, never drawn again (unless every task is retired).

Unseen and mixed tasks have weight 1. `sample` draws without replacement in proportion
to the weights (Efraimidis & Spirakis 2006 keys u^(1/w)); `draw` thins a stream of
candidates instead (e.g. the trainer's environment mixture), keeping each with probability
equal to its weight, so mixture weights and epoch order survive. `metrics()` reports counts and,
per difficulty (`info["level"]` or `info["difficulty"]`), the recent pass rate and the
share of saturated tasks. `state_dict()` is JSON-able, for checkpoints.

A sample is correct when its reward is at least `pass_threshold` (1.0: the answer
environments give 1 for right, 0 or -0.5 for wrong). Pass only valid samples' rewards:
failed rollouts or grades are not wrong answers.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rldojo.types import Task

__all__ = ["Curriculum", "CurriculumConfig"]

_HISTORY = 8
"""Groups remembered per task (at least `window` are always kept)."""


@dataclass(frozen=True)
class CurriculumConfig:
    """Knobs of the online curriculum (see the module docstring)."""

    window: int = 2
    """A task is saturated when its last `window` groups were all-correct (or all-wrong)."""
    mode: Literal["downweight", "retire"] = "downweight"
    saturated_weight: float = 0.1
    """Sampling weight of a saturated task in `downweight` mode (unseen/mixed: 1)."""
    pass_threshold: float = 1.0
    difficulty_key: str | None = None
    """`Task.info` key for per-difficulty metrics; None tries "level", then "difficulty"."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.mode not in ("downweight", "retire"):
            raise ValueError(f"mode must be 'downweight' or 'retire', got {self.mode!r}")
        if not 0.0 <= self.saturated_weight <= 1.0:
            raise ValueError(f"saturated_weight must be in [0, 1], got {self.saturated_weight}")


class Curriculum:
    """Per-task history of group outcomes and the sampling weights derived from it."""

    def __init__(self, tasks: Sequence[Task] = (), config: CurriculumConfig | None = None) -> None:
        self.config = config or CurriculumConfig()
        self._history: dict[str, deque[tuple[int, int]]] = {}
        self._difficulty: dict[str, str] = {t.id: self._difficulty_of(t) for t in tasks}
        self.exhausted = 0
        """Draws that found no task with weight > 0 (or hit `max_draws`) and fell back."""

    def _difficulty_of(self, task: Task) -> str:
        keys = (
            [self.config.difficulty_key] if self.config.difficulty_key else ["level", "difficulty"]
        )
        for key in keys:
            if key in task.info:
                return str(task.info[key])
        return "all"

    # ------------------------------------------------------------------ updates

    def observe(self, task_id: str, rewards: Sequence[float]) -> None:
        """Record one group of a task: the rewards of its valid samples (empty: ignored)."""
        if not rewards:
            return
        passes = sum(r >= self.config.pass_threshold for r in rewards)
        keep = max(_HISTORY, self.config.window)
        self._history.setdefault(task_id, deque(maxlen=keep)).append((passes, len(rewards)))

    def status(self, task_id: str) -> str:
        """`new`, `mixed`, `all_correct` or `all_wrong` (over the last `window` groups)."""
        recent = list(self._history.get(task_id, ()))[-self.config.window :]
        if len(recent) < self.config.window:
            return "new" if not recent else "mixed"
        if all(p == n for p, n in recent):
            return "all_correct"
        if all(p == 0 for p, _ in recent):
            return "all_wrong"
        return "mixed"

    def weight(self, task_id: str) -> float:
        """Sampling weight: 1 for new and mixed tasks, lower (or 0) for saturated ones."""
        if self.status(task_id) in ("new", "mixed"):
            return 1.0
        return 0.0 if self.config.mode == "retire" else self.config.saturated_weight

    def sample(self, tasks: Sequence[Task], n: int, rng: random.Random) -> list[Task]:
        """`n` tasks drawn without replacement in proportion to their weights.

        When fewer than `n` tasks have weight > 0, those are all taken and the rest is
        drawn again (with replacement) among them; when none has, uniformly from all.
        """
        if n <= 0 or not tasks:
            return []
        weighted = [(t, self.weight(t.id)) for t in tasks]
        live = [(t, w) for t, w in weighted if w > 0]
        if not live:
            self.exhausted += 1
            live = [(t, 1.0) for t in tasks]
        keyed = sorted(live, key=lambda tw: rng.random() ** (1.0 / tw[1]), reverse=True)
        chosen = [t for t, _ in keyed[:n]]
        while len(chosen) < n:
            chosen.append(rng.choices([t for t, _ in live], weights=[w for _, w in live])[0])
        return chosen

    def draw(
        self,
        next_tasks: Callable[[int], Sequence[Task]],
        n: int,
        rng: random.Random,
        *,
        max_draws: int | None = None,
    ) -> list[Task]:
        """`n` tasks from a stream of candidates, each kept with probability `weight`.

        `next_tasks(k)` yields the next k candidates (e.g. `EnvMixture.draw`): rejection
        sampling keeps the stream's order, epochs and mixture weights, and only thins out
        saturated tasks. After `max_draws` candidates (default 20 n) the rest are taken
        as they come, so a fully saturated task set cannot stall training.
        """
        limit = 20 * n if max_draws is None else max_draws
        chosen: list[Task] = []
        seen = 0
        while len(chosen) < n:
            (task,) = next_tasks(1)
            seen += 1
            if seen > limit:
                self.exhausted += 1
                return [*chosen, task, *next_tasks(n - len(chosen) - 1)]
            if rng.random() < self.weight(task.id):
                chosen.append(task)
        return chosen

    # ------------------------------------------------------------------ reporting

    def metrics(self, prefix: str = "curriculum") -> dict[str, float]:
        """Counts by status, and per difficulty the recent pass rate and saturated share."""
        counts = {"new": 0, "mixed": 0, "all_correct": 0, "all_wrong": 0}
        per: dict[str, dict[str, float]] = {}
        for task_id, history in self._history.items():
            status = self.status(task_id)
            counts[status] += 1
            d = per.setdefault(
                self._difficulty.get(task_id, "unknown"),
                {"passes": 0, "samples": 0, "observed": 0, "saturated": 0},
            )
            for p, n in list(history)[-self.config.window :]:
                d["passes"] += p
                d["samples"] += n
            d["observed"] += 1
            d["saturated"] += status in ("all_correct", "all_wrong")
        out = {
            f"{prefix}/observed": float(len(self._history)),
            f"{prefix}/mixed": float(counts["mixed"] + counts["new"]),
            f"{prefix}/all_correct": float(counts["all_correct"]),
            f"{prefix}/all_wrong": float(counts["all_wrong"]),
            f"{prefix}/exhausted": float(self.exhausted),
        }
        for name, d in sorted(per.items()):
            out[f"{prefix}/difficulty/{name}/pass_rate"] = d["passes"] / max(d["samples"], 1)
            out[f"{prefix}/difficulty/{name}/saturated"] = d["saturated"] / max(d["observed"], 1)
            out[f"{prefix}/difficulty/{name}/observed"] = d["observed"]
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint."""
        return {
            "version": 1,
            "config": asdict(self.config),
            "history": {k: [list(g) for g in v] for k, v in self._history.items()},
            "exhausted": self.exhausted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output (the config stays the one given at construction)."""
        if state.get("version") != 1:
            raise ValueError(f"unknown curriculum state version {state.get('version')!r}")
        keep = max(_HISTORY, self.config.window)
        self._history = {
            k: deque(((int(p), int(n)) for p, n in v), maxlen=keep)
            for k, v in state["history"].items()
        }
        self.exhausted = int(state.get("exhausted", 0))
