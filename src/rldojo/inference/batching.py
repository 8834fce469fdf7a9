"""Which requests decode together: the job queue of `TransformersEngine`'s worker thread.

Each request becomes a `Job` (a prompt, `n` choices, how to sample, and what to report
about them) submitted from the server's event loop; the worker takes the next job plus
compatible ones that arrive within a short window and decodes them as one batch. Jobs are
compatible when they sample the same way (`Job.key`): same token limit, temperature,
top_p and stop strings. What each job reports (logprobs, its prompt echoed, tokens
streamed as they come) is per job, so those never split a batch. A job with a seed and a
temperature above 0 decodes alone: its output depends on the request only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rldojo.inference.token_stream import ChoiceStreams
from rldojo.types import SamplingParams

__all__ = ["Job", "JobQueue"]


@dataclass
class Job:
    """One request on the worker: a generation (`chat`) or texts to embed (`embed`)."""

    kind: str  # "chat" | "embed"
    future: concurrent.futures.Future[Any]
    prompt: list[int] = field(default_factory=list)
    n: int = 1
    sampling: SamplingParams | None = None
    texts: Sequence[str] = ()
    top_logprobs: int | None = None
    """Alternatives per token to score after decoding; None: no logprobs asked for."""
    echo: bool = False
    """Also return the prompt's tokens (scored too, with `top_logprobs`)."""
    streams: ChoiceStreams | None = None
    """Where the tokens go as they are sampled (a streamed request)."""

    @property
    def key(self) -> tuple[Any, ...] | None:
        """Jobs with equal non-None keys may share one batch."""
        s = self.sampling
        if self.kind != "chat" or s is None:
            return None
        if not s.greedy and s.seed is not None:
            return None  # seeded sampling: alone, so the output depends on this request only
        return (s.max_new_tokens, s.temperature if not s.greedy else 0.0, s.top_p, s.stop)


class JobQueue:
    """Jobs waiting for the worker, taken a batch at a time.

    Args:
        max_batch: most sequences (jobs x `n`) in one batch.
        batch_window_s: how long to wait for more jobs to join a batch.
    """

    def __init__(self, max_batch: int, batch_window_s: float) -> None:
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.jobs: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.closed:
                raise RuntimeError("engine is closed")
            self.jobs.append(job)
            self.cond.notify()

    def take(self) -> list[Job] | None:
        """The next job plus compatible jobs that arrive within the batch window; None
        once the queue is closed."""
        with self.cond:
            while not self.jobs and not self.closed:
                self.cond.wait()
            if self.closed:
                return None
            first = self.jobs.popleft()
            if first.key is None:
                return [first]
            batch, rows = [first], first.n
            deadline = time.monotonic() + self.batch_window_s
            while rows < self.max_batch:
                match = next((j for j in self.jobs if j.key == first.key), None)
                if match is not None and rows + match.n <= self.max_batch:
                    self.jobs.remove(match)
                    batch.append(match)
                    rows += match.n
                    continue
                left = deadline - time.monotonic()
                if match is not None or left <= 0:
                    break
                self.cond.wait(left)
            return batch

    def close(self) -> None:
        """Refuse new jobs, wake the worker, and fail the jobs still waiting."""
        with self.cond:
            self.closed = True
            pending = list(self.jobs)
            self.jobs.clear()
            self.cond.notify_all()
        for job in pending:
            job.future.set_exception(RuntimeError("engine closed"))
