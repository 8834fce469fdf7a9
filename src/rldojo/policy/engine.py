"""`DecodeEngine`: one worker thread that decodes every request in flight as one batch,
continuously at the token level, across requests that arrive one at a time.

Why: the rollout engine runs one coroutine per episode, and each asks for one completion
whenever its environment has answered. Decoding each request alone wastes the batch (a
decode step costs about the same for 1 row as for 64 on CPUs, `rldojo.policy.sampling`);
gathering requests into `generate` calls makes every episode wait for the slowest of its
call. The engine takes requests from any thread or event loop (`submit` returns a
`concurrent.futures.Future`; `TransformersPolicy.agenerate` awaits it) and runs
`rldojo.policy.sampling`'s loop across them, with the same pieces:

- join: queued requests are prefilled together and join the running decode batch
  before its next step, once a quarter of the rows in flight are waiting or the oldest
  has waited `join_after` decode steps (a join prefills and copies the batch's keys and
  values: joining rows one by one would pay that per row); an idle engine first lets the
  requests arriving together queue for up to `gather_s`, so a batch's episodes prefill
  as one. Identical prompts among them are run once
  (a GRPO group's G requests, submitted in one go, are usually taken in one go; one
  that comes a step later is prefilled again), and a start the prefix cache holds is
  not recomputed. A model whose
  cache cannot be joined (sliding windows) admits new rows only when the batch drains.
- leave: a request that ends (an end token, a stop string, its `max_new_tokens`) leaves
  the batch and its future resolves at that step; a cancelled one leaves too.
- bounds: at most `max_batch` rows are in flight; the rest wait in arrival order.
- kinds: rows share a batch only when they sample alike (temperature and top_p: one
  `sample_next` call per step); `max_new_tokens` and stop strings are per request. A
  queued request of another kind waits until the batch drains, and so do the requests
  queued after it (none overtakes it, so no kind starves).

Seeds: every sampled (not greedy) request draws from a generator of its own. With
`sampling.seed` set, the generator is seeded with it as it is, the way `sample` seeds
row i with `token_choice.row_seeds(seed, n)[i]`: a request whose seed is that row's
samples what the row samples, whatever else is in flight (up to float summation order).
The episodes engine (`rldojo.rollout.concurrent`) hands episode i those seeds, so a
single-turn batch draws the same tokens under both engines. Requests with equal seeds
and prompts sample alike: give each request of a group its own seed. Without a seed,
the generator is seeded from torch's global generator at `submit`.

Weights: the engine runs the model only inside its `ModelHost`'s `step`, one prefill or
decode step at a time, so a `generate` call or a weight update can take the model
between two steps. `TransformersPolicy`'s host takes the policy's lock for each step,
loads weights `update_weights` staged meanwhile, and yields the weights' fingerprint.
A request in flight across an update samples its later tokens from the new weights
(its earlier keys and values stay); its keys and values are then not kept.

Prefix cache: a lasting `PrefixCache` (`rldojo.policy.prefix_cache`): each finished row's
keys and values are stored, a later request that continues its conversation takes
them, and a change of the weights' fingerprint empties it.

Errors: an exception in a step (the model's) fails the future of every request in flight
and queued with it; the engine then serves later requests. `close` stops the thread
and fails what is pending with `EngineClosedError`.

Counters (`stats`, those of `EnginePolicy.engine_stats`): `decode_steps` forward passes
of one token per row and `decode_rows` their rows summed, `generated_tokens` tokens
sampled (each request's first comes from its prefill), `prefill_tokens` the prompt
tokens of the requests prefilled less `reused_tokens`, those the prefix cache served
(identical prompts run once are counted once each request), `joins`
requests that joined a batch already decoding, `busy_s` seconds in steps (model and
sampling), `max_rows` the most rows in flight at once.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from rldojo.policy.base import Tokenizer
from rldojo.policy.prefix_cache import Fingerprint, PrefixCache, joinable, weights_fingerprint
from rldojo.policy.sampling import (
    SampledRow,
    _advance,
    _join,
    _pad_id,
    _prefill_rows,
    _record,
    _Running,
    _store_ended,
)
from rldojo.policy.token_choice import sample_next
from rldojo.types import SamplingParams

__all__ = [
    "DEFAULT_MAX_BATCH",
    "STATS",
    "DecodeEngine",
    "EngineClosedError",
    "ModelHost",
    "OwnModel",
]

# Rows decoded at once. On 2 cores in bf16, 64 rows in one batch give ~2x the tokens/s of
# 16 slots (benchmarks/results/continuous_batching.json), so keep the slots wide.
DEFAULT_MAX_BATCH = 64

STATS = (
    "decode_steps",
    "decode_rows",
    "generated_tokens",
    "prefill_tokens",
    "reused_tokens",
    "joins",
    "busy_s",
    "max_rows",
)
"""The engine's counters (module docstring); each only grows."""


class EngineClosedError(RuntimeError):
    """The engine was closed before the request finished (or was submitted after)."""


class ModelHost(Protocol):
    """Who lends the engine its model, one step at a time."""

    def step(self) -> AbstractContextManager[Fingerprint]:
        """Hold the model for one step (nobody else runs it or changes its weights
        meanwhile); yields its weights' fingerprint (`weights_fingerprint`)."""
        ...

    def idle(self) -> None:
        """Nothing is in flight any more (a transient copy frees its weights)."""
        ...


class OwnModel:
    """The `ModelHost` of a model only the engine runs: nothing to lock; its fingerprint."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    @contextmanager
    def step(self) -> Iterator[Fingerprint]:
        model = self._model
        # a plain callable (tests) has no parameters to fingerprint
        yield weights_fingerprint(model, 0) if isinstance(model, torch.nn.Module) else ()

    def idle(self) -> None:
        pass


GATHER_S = 0.01
"""Seconds an idle engine lets requests arriving together queue before it prefills them."""

JOIN_AFTER = 4
"""Decode steps a queued request waits at most before it joins a running batch."""

Kind = tuple[float, float]
"""How a request samples: (temperature, top_p); greedy is (0.0, 1.0)."""


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: Future[SampledRow]
    generator: torch.Generator | None  # None: greedy
    row: SampledRow = field(default_factory=SampledRow)
    fingerprint: Fingerprint | None = None  # the weights it was prefilled with
    queued_at: float = 0.0  # `decode_steps` when it was queued

    @property
    def kind(self) -> Kind:
        s = self.sampling
        return (0.0, 1.0) if s.greedy else (s.temperature, s.top_p)


def _generator(sampling: SamplingParams) -> torch.Generator | None:
    """The request's own generator (module docstring, Seeds); None for greedy."""
    if sampling.greedy:
        return None
    seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()))
    return torch.Generator().manual_seed(seed)


def _settle(future: Future[SampledRow], outcome: SampledRow | BaseException) -> None:
    """Resolve `future` unless it is done already (cancelled by its caller)."""
    if future.done():
        return
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled meanwhile
        pass


class DecodeEngine:
    """Decodes the requests in flight as one batch on a worker thread (module docstring).

    `model`: a transformers causal LM (or a callable taking its keywords); `eos_ids`: the
    tokens that end a completion; `max_batch`: most rows in flight; `prefix_cache`: a
    lasting `PrefixCache`, or None; `host`: who lends the model (default `OwnModel`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        eos_ids: set[int],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefix_cache: PrefixCache | None = None,
        host: ModelHost | None = None,
        gather_s: float = GATHER_S,
        join_after: int = JOIN_AFTER,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefix_cache is not None and not prefix_cache.lasting:
            raise ValueError("the engine's prefix cache must be lasting (no calls to end)")
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, eos_ids
        self.max_batch, self.gather_s, self.join_after = max_batch, gather_s, join_after
        self.prefix_cache = prefix_cache
        self._host = host if host is not None else OwnModel(model)
        self._pad_id = _pad_id(tokenizer, eos_ids)
        self._cond = threading.Condition()  # guards the queue and `_closed`
        self._queue: collections.deque[_Request] = collections.deque()
        self._closed = False
        self._stats = dict.fromkeys(STATS, 0.0)
        # the worker thread's own: the running batch and its requests by row id
        self._run: _Running | None = None
        self._kind: Kind = (0.0, 1.0)
        self._live: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._busy = False  # a step ran since the host last heard `idle`
        self._thread = threading.Thread(target=self._serve, name="rldojo-decode", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, prompt: Sequence[int], sampling: SamplingParams) -> Future[SampledRow]:
        """Queue one prompt; the future resolves with its sample when it ends (or fails
        with the model's exception, or `EngineClosedError`)."""
        if not prompt:
            raise ValueError("an empty prompt: nothing to continue")
        future: Future[SampledRow] = Future()
        request = _Request(list(prompt), sampling, future, _generator(sampling))
        request.queued_at = self._stats["decode_steps"]
        with self._cond:
            if self._closed:
                raise EngineClosedError("the decode engine is closed")
            if sampling.max_new_tokens <= 0:
                future.set_result(SampledRow())  # nothing to sample (as `sample`)
            else:
                self._queue.append(request)
                self._cond.notify()
        return future

    def stats(self) -> dict[str, float]:
        """The counters so far (module docstring)."""
        return dict(self._stats)

    def close(self) -> None:
        """Stop the worker after its current step; pending requests fail. Idempotent."""
        with self._cond:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for request in queued:
            _settle(request.future, EngineClosedError("the decode engine was closed"))
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _serve(self) -> None:
        """The worker thread: admit requests, step, until closed."""
        with torch.no_grad():
            while True:
                try:
                    admitted = self._wait_for_work()
                    if admitted is None:
                        break
                    self._step(admitted)
                except Exception as exc:  # the model's: fail what is in flight, go on
                    self._fail_all(exc)
        self._fail_all(EngineClosedError("the decode engine was closed"))
        self._go_idle()

    def _wait_for_work(self) -> list[_Request] | None:
        """The requests to admit now (maybe none: keep decoding); None once closed.
        Blocks while nothing is in flight or queued (after telling the host so)."""
        if self._run is None:
            with self._cond:
                drained = not self._queue
            if drained:
                self._go_idle()
        with self._cond:
            while not self._closed and self._run is None and not self._queue:
                self._cond.wait()
            if self._run is None:
                self._gather()
            elif not self._due():
                return None if self._closed else []
            return None if self._closed else self._admit()

    def _gather(self) -> None:
        """Starting from idle: let the requests that are arriving together (a batch's
        episodes, submitted one coroutine after another) queue, for up to `gather_s`,
        so that they prefill as one batch (`_cond` held)."""
        deadline = time.monotonic() + self.gather_s
        while not self._closed and len(self._queue) < self.max_batch:
            seen, left = len(self._queue), deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(min(left, self.gather_s / 5))
            if len(self._queue) == seen:  # a quiet moment: they have arrived
                return

    def _due(self) -> bool:
        """Whether queued requests join the running batch at this step: once a quarter
        of the rows in flight (at least one) are waiting, or the oldest has waited
        `join_after` decode steps. A join prefills and copies the batch's cache, so
        joining rows one at a time would pay that per row (`_cond` held)."""
        if not self._queue:
            return False
        waiting = len(self._queue) >= max(1, len(self._live) // 4)
        return waiting or self._stats["decode_steps"] - self._queue[0].queued_at >= self.join_after

    def _go_idle(self) -> None:
        if self._busy:
            self._busy = False
            self._host.idle()

    def _admit(self) -> list[_Request]:
        """Take queued requests that may join the batch now (`_cond` held)."""
        run = self._run
        if run is not None and not joinable(run.cache):
            return []
        kind = self._kind if run is not None else None
        taken: list[_Request] = []
        while self._queue and len(self._live) + len(taken) < self.max_batch:
            head = self._queue[0]
            if head.future.cancelled():
                self._queue.popleft()
                continue
            kind = head.kind if kind is None else kind
            if head.kind != kind:
                break
            taken.append(self._queue.popleft())
        return taken

    def _step(self, admitted: list[_Request]) -> None:
        """Prefill and join `admitted`, then sample one token for every row and decode."""
        if not admitted and self._run is None:
            return
        self._busy = True
        with self._host.step() as fingerprint:
            start = time.perf_counter()
            if self.prefix_cache is not None:
                self.prefix_cache.check_weights(fingerprint)
            if admitted:
                self._prefill(admitted, fingerprint)
            self._decode(fingerprint)
            self._stats["busy_s"] += time.perf_counter() - start

    def _prefill(self, requests: list[_Request], fingerprint: Fingerprint) -> None:
        """Prefill `requests` as one batch and join them to the running one."""
        prompts: dict[int, list[int]] = {}
        for request in requests:
            request.fingerprint = fingerprint
            row = next(self._ids)
            self._live[row] = request
            prompts[row] = request.prompt
        new, reused = _prefill_rows(
            self.model, prompts, list(prompts), self._pad_id, self.prefix_cache
        )
        self._stats["prefill_tokens"] += sum(len(p) for p in prompts.values()) - reused
        self._stats["reused_tokens"] += reused
        if self._run is None:
            self._run, self._kind = new, requests[0].kind
        else:
            self._run = _join(self._run, new)
            self._stats["joins"] += len(requests)

    def _decode(self, fingerprint: Fingerprint) -> None:
        """Sample one token per row; resolve and drop the rows that ended; feed the rest."""
        run = self._run
        assert run is not None
        requests = [self._live[r] for r in run.rows]
        gens = [r.generator for r in requests if r.generator is not None]
        token, logp, ent = sample_next(run.logits, requests[0].sampling, gens or None)  # [B] x3
        rows, params = [r.row for r in requests], [r.sampling for r in requests]
        keep = _record(rows, params, token, logp, ent, self.tokenizer, self.eos_ids)
        keep = [i for i in keep if not requests[i].future.cancelled()]
        self._stats["generated_tokens"] += len(requests)
        self._stats["max_rows"] = max(self._stats["max_rows"], len(requests))
        kept = set(keep)
        ended = [i for i in range(len(requests)) if i not in kept]
        fed = {  # a finished row was fed all but its last token
            i: requests[i].prompt + requests[i].row.token_ids[:-1]
            for i in ended
            if requests[i].fingerprint == fingerprint and not requests[i].future.done()
        }
        _store_ended(self.prefix_cache, run, fed)
        for i in ended:
            _settle(self._live.pop(run.rows[i]).future, requests[i].row)
        if _advance(self.model, run, token, keep):
            self._stats["decode_steps"] += 1
            self._stats["decode_rows"] += len(keep)
        else:
            self._run = None

    def _fail_all(self, exc: BaseException) -> None:
        """Fail every request in flight or queued with `exc`; drop the running batch."""
        with self._cond:
            queued = list(self._queue)
            self._queue.clear()
        failed = [*self._live.values(), *queued]
        self._live.clear()
        self._run = None
        for request in failed:
            _settle(request.future, exc)
