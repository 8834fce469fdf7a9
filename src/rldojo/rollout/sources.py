"""Rollout sources: where the trainer gets each step's graded groups. The seam between
collecting experience and learning from it.

A source is built from narrow parts — a `TaskSampler` (what to roll out; the curriculum),
`Rounds` over a `Generation` (how: local policy or Ray actors; ledger commits) and the
ledger — never from the trainer. The trainer calls `collect(step, version)` and gets a
`Collected` (groups, phase times, extra rounds, the task sampler's metrics);
`checkpoint_state()` is the task-draw position a checkpoint must save; `close()` stops
what the source started.

One thread owns the task sampler: the one that draws and observes (the trainer's in
`SyncSource`, the producer's in `AsyncSource`). The curriculum behind it is plain dicts,
so a read from another thread while the owner observes can fail ("dictionary changed
size during iteration") or see half an update. The owner therefore takes the sampler's
metrics and draw state right after each batch and hands them over with the groups; the
trainer logs `Collected.task_metrics` and checkpoints `checkpoint_state()`, never the
sampler itself.

`SyncSource` (`rollout.max_policy_lag = 0`): each step's rounds are rolled out when the
step asks, with the current weights; groups without signal are refilled by drawing more
tasks (DAPO's dynamic sampling), up to `rollout.max_extra_rounds`.

`AsyncSource` (lag k >= 1): a producer thread (its own event loop, its own ledger
connection) draws tasks, rolls out and grades batches for the next steps while the
trainer trains. Staleness is bounded: the producer may start a batch only while fewer
than k batches are ahead of the trainer (a semaphore released each time a batch is
taken), so a sample is at most k weight updates old when trained on; an older batch
(after a slow step) is dropped, counted, and left untrained in the ledger. The loss
corrects for the stale behaviour policy with the PPO ratio against the stored behaviour
log-probabilities. When the trainer waits longer than `wait_warn_s`, the producer's
activity is logged; if the producer died, its error is raised in the trainer.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rldojo.config import RolloutConfig
from rldojo.rollout.generation import Rounds
from rldojo.rollout.groups import Collected, Group, oversampled
from rldojo.rollout.watchdog import Watchdog
from rldojo.store.ledger import Ledger

__all__ = ["ROUND_BASE", "AsyncSource", "RolloutSource", "SyncSource", "make_source"]

log = logging.getLogger("rldojo.pipeline")

ROUND_BASE = 100
"""The producer's batch b is ledger round `ROUND_BASE + b` (the synchronous source's
rounds are 0, 1, ... within a step)."""


class RolloutSource(Protocol):
    """Where the trainer gets each step's graded groups: `SyncSource`, `AsyncSource`."""

    def collect(self, step: int, version: int) -> Collected:
        """Groups for optimizer step `step`; `version` is the trainer's weight version."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """The draw position a checkpoint saves (`TaskSampler.state_dict` + `next_batch`)."""
        ...

    def close(self) -> None: ...


def _seed(run_seed: int, index: int, offset: int) -> int:
    return run_seed * 1_000_003 + index * 101 + offset


def _full(groups: list[Group], cfg: RolloutConfig, rounds: int) -> bool:
    enough = sum(g.informative for g in groups) >= cfg.prompts_per_step
    return enough or not cfg.dynamic_sampling or rounds >= cfg.max_extra_rounds


class SyncSource:
    """Rounds rolled out when the step asks (see the module docstring)."""

    def __init__(
        self,
        rounds: Rounds,
        cfg: RolloutConfig,
        ledger: Ledger,
        loop: asyncio.AbstractEventLoop,
        *,
        seed: int,
        next_batch: int = 0,
    ) -> None:
        self.rounds, self.cfg, self.ledger, self.loop, self.seed = rounds, cfg, ledger, loop, seed
        self.next_batch = next_batch  # an asynchronous run's position, kept across a resume
        self.watchdog = Watchdog(cfg.wait_warn_s)  # logs long phases with what they wait on

    def collect(self, step: int, version: int) -> Collected:
        try:
            return self.loop.run_until_complete(self._collect(step))
        finally:
            self.watchdog.set(None)

    async def _collect(self, step: int) -> Collected:
        groups: list[Group] = []
        timing = {"time/generate": 0.0, "time/grade": 0.0}
        rounds = 0
        while True:
            need = self.cfg.prompts_per_step - sum(g.informative for g in groups)
            tasks = self.rounds.tasks.draw(oversampled(need, self.cfg.oversample))
            groups += await self.rounds.run(
                tasks,
                _seed(self.seed, step, rounds),
                ledger=self.ledger,
                step=step,
                round=rounds,
                timing=timing,
                announce=self.watchdog.set,
            )
            if _full(groups, self.cfg, rounds):
                return Collected(groups, timing, rounds, self.rounds.tasks.metrics())
            rounds += 1

    def checkpoint_state(self) -> dict[str, Any]:
        return {**self.rounds.tasks.state_dict(), "next_batch": self.next_batch}

    def close(self) -> None:
        self.watchdog.close()


@dataclass
class _Batch:
    groups: list[Group]
    version: int
    index: int
    draw_state: dict[str, Any]  # the task-draw state after drawing and observing this batch
    task_metrics: dict[str, float]  # the task sampler's metrics at the same moment
    timing: dict[str, float] = field(default_factory=dict)


class AsyncSource:
    """A producer thread ahead of the trainer by at most `max_policy_lag` batches."""

    def __init__(
        self,
        rounds: Rounds,
        cfg: RolloutConfig,
        ledger_path: Path,
        *,
        seed: int,
        next_batch: int = 0,
        step: Callable[[], int] | None = None,
    ) -> None:
        if cfg.max_policy_lag < 1:
            raise ValueError("AsyncSource needs max_policy_lag >= 1 (0 is synchronous)")
        self.rounds, self.cfg, self.ledger_path, self.seed = rounds, cfg, ledger_path, seed
        self.max_lag = cfg.max_policy_lag
        self.wait_warn_s = cfg.wait_warn_s
        self._step = step or (lambda: 0)  # the trainer's step now: the ledger's step column
        self._queue: queue.Queue[_Batch] = queue.Queue()
        self._ahead = threading.Semaphore(self.max_lag)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.activity = "starting"
        self.activity_since = time.monotonic()
        self.batches = next_batch  # the next batch's index (continues across resumes)
        self.consumed: tuple[int, dict[str, Any]] | None = None
        self._start = (next_batch, rounds.tasks.state_dict())  # before the producer draws
        self._thread = threading.Thread(target=self._run, name="rldojo-rollouts", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer

    def _set_activity(self, text: str) -> None:
        self.activity, self.activity_since = text, time.monotonic()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        ledger = Ledger(self.ledger_path)
        try:
            while not self._stop.is_set():
                if not self._ahead.acquire(timeout=0.2):
                    self._set_activity("waiting for the trainer (lag bound)")
                    continue
                if self._stop.is_set():  # woken by `close`, not by the trainer: no new batch
                    break
                self._queue.put(loop.run_until_complete(self._produce(ledger)))
        except BaseException as exc:  # surfaced to the trainer by `take`
            self._error = exc
        finally:
            ledger.close()
            loop.close()

    async def _produce(self, ledger: Ledger) -> _Batch:
        """Batch b: its tasks, seed and ledger round follow from b and the draw state, so
        after a resume the same batch is drawn again, and reused if it was committed.

        The draw state is taken after the round has reported its groups to the sampler:
        batch b+1 was drawn by a curriculum that had seen batch b, so a run resumed after
        batch b must start from that curriculum to draw the same batch b+1 again."""
        b = self.batches
        sampler = self.rounds.tasks
        tasks = sampler.draw(oversampled(self.cfg.prompts_per_step, self.cfg.oversample))
        self.batches += 1
        timing: dict[str, float] = {"time/generate": 0.0, "time/grade": 0.0}
        groups = await self.rounds.run(
            tasks,
            _seed(self.seed, b, 7),
            ledger=ledger,
            step=self._step(),
            round=ROUND_BASE + b,
            any_step=True,
            timing=timing,
            announce=self._set_activity,
        )
        rollouts = [r for g in groups for r in g.rollouts]
        version = min((r.policy_version for r in rollouts), default=self.rounds.version())
        return _Batch(groups, version, b, sampler.state_dict(), sampler.metrics(), timing)

    # ------------------------------------------------------------------ consumer

    def take(self, current_version: int) -> tuple[_Batch, dict[str, float]]:
        """The next batch within the lag bound (older ones are dropped), and its counters.
        `consumed` is then (next batch index, task-draw state after the last taken batch):
        what a checkpoint saves, since the producer has drawn further ahead."""
        dropped = 0
        waited = 0.0
        while True:
            started = time.monotonic()
            batch = self._get()
            waited += time.monotonic() - started
            self._ahead.release()  # the producer may start the next batch now
            self.consumed = (batch.index + 1, batch.draw_state)
            lag = current_version - batch.version
            if lag <= self.max_lag:
                info = dict(batch.timing)
                info |= {"rollout/policy_lag": lag, "rollout/stale_dropped": dropped}
                info["time/wait_rollouts"] = waited
                return batch, info
            dropped += len(batch.groups)
            log.info(
                "dropped %d groups %d versions old (max lag %d)",
                len(batch.groups),
                lag,
                self.max_lag,
            )

    def collect(self, step: int, version: int) -> Collected:
        """Batches until enough groups carry signal (dynamic sampling), within the bound."""
        groups: list[Group] = []
        timing: dict[str, float] = {}
        rounds = 0
        while True:
            batch, info = self.take(version)
            groups += batch.groups
            for key, value in info.items():
                timing[key] = timing.get(key, 0.0) + value
            if _full(groups, self.cfg, rounds):  # the sampler as the last batch left it
                return Collected(groups, timing, rounds, batch.task_metrics)
            rounds += 1

    def _get(self) -> _Batch:
        warned_at = time.monotonic()
        while True:
            if self._error is not None:
                raise RuntimeError("the rollout producer failed") from self._error
            try:
                return self._queue.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - warned_at >= self.wait_warn_s:
                    warned_at = time.monotonic()
                    busy = time.monotonic() - self.activity_since
                    log.info(
                        "trainer waiting on rollouts: producer is %s (for %.0fs)",
                        self.activity,
                        busy,
                    )

    def checkpoint_state(self) -> dict[str, Any]:
        # The producer draws ahead; a resumed run must redraw what was not trained yet.
        next_batch, draws = self.consumed or self._start
        return {**draws, "next_batch": next_batch}

    def close(self) -> None:
        self._stop.set()
        self._ahead.release()
        self._thread.join(timeout=600)


def make_source(
    rounds: Rounds,
    cfg: RolloutConfig,
    ledger: Ledger,
    loop: asyncio.AbstractEventLoop,
    *,
    seed: int,
    next_batch: int,
    step: Callable[[], int],
) -> RolloutSource:
    """`AsyncSource` when `cfg.max_policy_lag >= 1`, else `SyncSource`."""
    if cfg.max_policy_lag >= 1:
        return AsyncSource(rounds, cfg, ledger.path, seed=seed, next_batch=next_batch, step=step)
    return SyncSource(rounds, cfg, ledger, loop, seed=seed, next_batch=next_batch)
