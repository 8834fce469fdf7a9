"""Asynchronous rollouts: generation for the next step overlaps training on this one.

A producer thread (its own event loop, its own ledger connection) draws tasks, rolls
out G samples per task with the current policy weights, grades them, commits them to the
ledger and queues the groups. The trainer takes groups from the queue.

Staleness is bounded by `max_policy_lag` (k): the producer may start a batch only while
fewer than k batches are ahead of the trainer (a semaphore the trainer releases each time
it takes a batch), so a sample is at most k weight updates old when trained on; any
group older than that (e.g. after a slow step) is dropped, counted, and left untrained in
the ledger. The loss corrects for the stale behaviour policy with the PPO ratio against
the stored behaviour log-probabilities (see `Trainer._optimize`).

When the trainer waits longer than `wait_warn_s`, it logs what the producer is doing
(which tasks, since when); if the producer thread died, the error is re-raised in the
trainer instead of hanging.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rldojo.store.ledger import Ledger

if TYPE_CHECKING:
    from rldojo.train.step_metrics import Group
    from rldojo.train.trainer import Trainer

log = logging.getLogger("rldojo.pipeline")


ROUND_BASE = 100
"""The producer's batch b is ledger round `ROUND_BASE + b` (the synchronous trainer's
rounds are 0, 1, ... within a step)."""


@dataclass
class _Batch:
    groups: list[Group]
    version: int
    index: int
    draw_state: dict  # the task-draw state after drawing this batch (for checkpoints)
    timing: dict[str, float] = field(default_factory=dict)


class AsyncRollouts:
    """Produces graded groups in the background for a `Trainer` (lag >= 1)."""

    def __init__(
        self, trainer: Trainer, max_policy_lag: int, wait_warn_s: float = 60.0, first_batch: int = 0
    ) -> None:
        if max_policy_lag < 1:
            raise ValueError("AsyncRollouts needs max_policy_lag >= 1 (0 is synchronous)")
        self.trainer = trainer
        self.max_lag = max_policy_lag
        self.wait_warn_s = wait_warn_s
        self._queue: queue.Queue[_Batch] = queue.Queue()
        self._ahead = threading.Semaphore(max_policy_lag)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.activity = "starting"
        self.consumed: tuple[int, dict] | None = None
        self.activity_since = time.monotonic()
        self.batches = first_batch  # the next batch's index (continues across resumes)
        self._thread = threading.Thread(target=self._run, name="rldojo-rollouts", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer

    def _set_activity(self, text: str) -> None:
        self.activity, self.activity_since = text, time.monotonic()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        ledger = Ledger(self.trainer.ledger.path)
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
        after a resume the same batch is drawn again, and reused if it was committed."""
        t = self.trainer
        cfg = t.config
        b = self.batches
        tasks = t.draw_tasks(t.oversampled(cfg.rollout.prompts_per_step))
        draw_state = t.draw_state()
        seed = cfg.run.seed * 1_000_003 + b * 101 + 7
        self.batches += 1
        timing: dict[str, float] = {"time/generate": 0.0, "time/grade": 0.0}
        requests = t.requests(tasks, seed)
        committed = ledger.find_round(None, ROUND_BASE + b)
        if len(committed) == len(requests):  # graded before a crash: reuse, don't redo
            ids = [i for i, _, _ in committed]
            rollouts, scores = [r for _, r, _ in committed], [s for _, _, s in committed]
            timing["rollout/reused"] = len(ids)
        else:
            rollouts, scores = await t.generate_and_grade(
                requests, seed, timing, announce=self._set_activity
            )
            ids = ledger.add(t.step_num, rollouts, scores, round=ROUND_BASE + b)
        version = min((r.policy_version for r in rollouts), default=t.policy.version)
        return _Batch(t._groups(tasks, rollouts, scores, ids), version, b, draw_state, timing)

    # ------------------------------------------------------------------ consumer

    def take(self, current_version: int) -> tuple[list[Group], dict[str, float]]:
        """The next batch of groups within the lag bound (older ones are dropped).
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
                return batch.groups, info
            dropped += len(batch.groups)
            log.warning("dropped %d groups %d versions old (max lag %d)", len(batch.groups),
                        lag, self.max_lag)  # fmt: skip

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
                    log.warning("trainer waiting on rollouts: producer is %s (for %.0fs)",
                                self.activity, busy)  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        self._ahead.release()
        self._thread.join(timeout=600)


class Watchdog:
    """Logs what a phase is waiting on while it lasts longer than `warn_s` (again every
    `warn_s`): the synchronous trainer's counterpart of the producer's activity log.
    `set(text)` names the current phase; a daemon thread does the watching."""

    def __init__(self, warn_s: float) -> None:
        self.warn_s = warn_s
        self.activity: str | None = None
        self.since = time.monotonic()
        self.warnings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rldojo-watchdog", daemon=True)
        self._thread.start()

    def set(self, text: str | None) -> None:
        self.activity, self.since = text, time.monotonic()

    def _watch(self) -> None:
        warned_for = (0.0, 0.0)  # (phase start, how long it had lasted at the last warning)
        while not self._stop.wait(min(1.0, self.warn_s / 4)):
            activity, since = self.activity, self.since
            busy = time.monotonic() - since
            last = warned_for[1] if warned_for[0] == since else 0.0
            if activity is not None and busy - last >= self.warn_s:
                log.warning("still %s (for %.1fs)", activity, busy)
                self.warnings += 1
                warned_for = (since, busy)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
