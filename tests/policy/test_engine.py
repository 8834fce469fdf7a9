"""The decode engine (`rldojo.policy.engine`): requests submitted one at a time decode as
if each were sampled alone, join a batch already decoding, stay within `max_batch`, keep
their seeds, survive a failing model, reuse a finished turn's keys and values, and fail
when the engine closes; `TransformersPolicy.agenerate` serves concurrent tasks.

Where a test needs a request mid-decode it does not wait for time to pass: `Gate` holds
the model's first decode step until the test has submitted what should join."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch

from rldojo.policy.engine import DecodeEngine, EngineClosedError
from rldojo.policy.prefix_cache import Entry, PrefixCache
from rldojo.policy.sampling import SampledRow, sample
from rldojo.policy.token_choice import row_seeds
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # samples from tiny-random

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
WAIT_S = 60.0  # bound on every wait: a loaded 2-core machine is slow, never this slow


class Gate:
    """A model whose first decode step (one token per row) sets `entered` and waits for
    `opened`: while it waits, the requests it decodes are mid-decode. `fail` makes every
    forward raise."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.fail = False

    def __call__(self, **kwargs):
        if self.fail:
            raise RuntimeError("model failure")
        if kwargs["input_ids"].shape[1] == 1 and not self.opened.is_set():
            self.entered.set()
            assert self.opened.wait(WAIT_S)
        return self.model(**kwargs)


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _result(future: Future[SampledRow]) -> SampledRow:
    return future.result(timeout=WAIT_S)


def _alone(model, tok, prompt, params, eos) -> SampledRow:
    batch = sample(model, tok, [prompt], params, eos)
    return SampledRow(
        batch.token_ids[0], batch.logprobs[0], batch.entropies[0], batch.finish_reasons[0]
    )


def _assert_same(row: SampledRow, ref: SampledRow) -> None:
    assert row.token_ids == ref.token_ids
    assert row.finish_reason == ref.finish_reason
    # fp32 kernels differ with the batch shape (~1e-5): ids exactly, log-probs to 1e-4
    assert torch.allclose(torch.tensor(row.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


@pytest.fixture
def engines():
    """Engines a test starts, closed after it."""
    started: list[DecodeEngine] = []

    def start(model, tok, eos, **kwargs) -> DecodeEngine:
        started.append(DecodeEngine(model, tok, eos, **kwargs))
        return started[-1]

    yield start
    for engine in started:
        engine.close()


def test_greedy_requests_sample_what_each_samples_alone(sharp, engines):
    model, tok, prompts = sharp
    params = replace(GREEDY, max_new_tokens=12)
    free = [_alone(model, tok, p, params, set()).token_ids for p in prompts]
    eos = {free[0][2], free[1][6], free[2][0]}  # rows end at different steps, by end tokens
    params = replace(params, stop=(tok.decode([free[4][4]]),))  # ... or a stop string
    engine = engines(model, tok, eos, max_batch=8)
    futures = [engine.submit(p, params) for p in prompts]
    rows = [_result(f) for f in futures]
    assert len({len(r.token_ids) for r in rows}) >= 2
    assert "stop" in {r.finish_reason for r in rows}
    for prompt, row in zip(prompts, rows, strict=True):
        _assert_same(row, _alone(model, tok, prompt, params, eos))
    stats = engine.stats()
    assert stats["generated_tokens"] == sum(len(r.token_ids) for r in rows)
    assert stats["prefill_tokens"] == sum(len(p) for p in prompts)


def test_a_request_joins_a_batch_already_decoding(sharp, engines):
    model, tok, prompts = sharp
    gate = Gate(model)
    engine = engines(gate, tok, set(), max_batch=4)
    first = engine.submit(prompts[0], replace(GREEDY, max_new_tokens=10))
    assert gate.entered.wait(WAIT_S)  # `first` is mid-decode
    assert not first.done() and engine.stats()["joins"] == 0
    second = engine.submit(prompts[3], GREEDY)
    gate.opened.set()
    rows = [_result(first), _result(second)]
    stats = engine.stats()
    assert stats["joins"] == 1
    assert stats["max_rows"] == 2
    assert stats["decode_rows"] > stats["decode_steps"]  # some steps decoded both
    _assert_same(rows[0], _alone(model, tok, prompts[0], replace(GREEDY, max_new_tokens=10), set()))
    _assert_same(rows[1], _alone(model, tok, prompts[3], GREEDY, set()))


def test_a_seeded_request_samples_alike_alone_and_in_company(sharp, engines):
    model, tok, prompts = sharp
    # T = 0.5: at T = 1 this random model's tails are flat enough that float noise of the
    # batch composition can move the cdf past a uniform draw
    seeded = SamplingParams(max_new_tokens=10, temperature=0.5, seed=row_seeds(7, 1)[0])
    alone = _result(engines(model, tok, set()).submit(prompts[1], seeded))
    # the seed `sample` gives a call's first prompt: the same tokens
    _assert_same(alone, _alone(model, tok, prompts[1], replace(seeded, seed=7), set()))

    gate = Gate(model)
    engine = engines(gate, tok, set())
    company = [
        engine.submit(prompts[0], replace(seeded, seed=None)),
        engine.submit(prompts[3], replace(seeded, seed=8)),
    ]
    assert gate.entered.wait(WAIT_S)
    joined = engine.submit(prompts[1], seeded)
    gate.opened.set()
    _assert_same(_result(joined), alone)
    assert all(len(_result(f).token_ids) == 10 for f in company)
    assert engine.stats()["joins"] == 1
    other = _result(engines(model, tok, set()).submit(prompts[1], replace(seeded, seed=8)))
    assert other.token_ids != alone.token_ids


def test_max_batch_bounds_the_rows_in_flight(sharp, engines):
    model, tok, prompts = sharp
    gate = Gate(model)
    engine = engines(gate, tok, set(), max_batch=2)
    futures = [engine.submit(prompts[0], GREEDY)]
    assert gate.entered.wait(WAIT_S)
    chosen = [prompts[i % len(prompts)] for i in range(1, 8)]
    futures += [engine.submit(p, GREEDY) for p in chosen]  # 4x max_batch in all
    gate.opened.set()
    rows = [_result(f) for f in futures]
    stats = engine.stats()
    assert stats["max_rows"] == 2
    assert stats["decode_rows"] <= 2 * stats["decode_steps"]
    for prompt, row in zip([prompts[0], *chosen], rows, strict=True):
        _assert_same(row, _alone(model, tok, prompt, GREEDY, set()))


def test_a_failing_model_fails_the_requests_and_the_next_succeeds(sharp, engines):
    model, tok, prompts = sharp
    gate = Gate(model)
    gate.opened.set()
    engine = engines(gate, tok, set())
    gate.fail = True
    futures = [engine.submit(p, GREEDY) for p in prompts[:3]]
    for future in futures:
        with pytest.raises(RuntimeError, match="model failure"):
            _result(future)
    gate.fail = False
    _assert_same(
        _result(engine.submit(prompts[1], GREEDY)), _alone(model, tok, prompts[1], GREEDY, set())
    )


def _next_turn(tok, prompt: list[int], row: SampledRow) -> list[int]:
    """The conversation continued: the sampled turn, then a new user message's tokens."""
    reply = tok("<|im_start|>user\nand then?<|im_end|>\n", add_special_tokens=False)
    return prompt + row.token_ids + list(reply["input_ids"])


def test_a_next_turn_reuses_the_finished_turns_keys_and_samples_the_same(sharp, engines):
    model, tok, prompts = sharp
    cache = PrefixCache(64 << 20, lasting=True)
    engine = engines(model, tok, set(), prefix_cache=cache)
    first = _result(engine.submit(prompts[1], GREEDY))
    second = _next_turn(tok, prompts[1], first)
    row = _result(engine.submit(second, GREEDY))
    _assert_same(row, _alone(model, tok, second, GREEDY, set()))
    reused = len(prompts[1]) + len(first.token_ids) - 1  # the last sampled token was never fed
    stats = engine.stats()
    assert stats["reused_tokens"] == reused
    assert stats["prefill_tokens"] == len(prompts[1]) + len(second) - reused
    # the second turn took its entry; its own stays until a third turn takes it
    assert cache.take(second[:-1]) is None and cache.nbytes > 0


def _entry(length: int) -> Entry:
    return Entry([torch.zeros(1, length, 2)], [torch.zeros(1, length, 2)])  # 16 bytes a token


def test_the_lasting_cache_keeps_entries_until_taken_and_evicts_the_oldest():
    cache = PrefixCache(3 * 20 * 16, lasting=True)  # three 20-token entries
    cache.check_weights(("w", 1))
    for first in range(4):  # four conversations: the oldest is evicted
        cache.store([first] * 20, _entry(20))
    assert cache.nbytes == 3 * 20 * 16
    assert cache.take([0] * 21) is None
    assert cache.take([1] * 21) is not None
    assert cache.take([1] * 21) is None  # taken once, then freed
    assert cache.nbytes == 2 * 20 * 16
    cache.check_weights(("w", 1))  # same weights: kept
    assert cache.take([2] * 21) is not None
    cache.check_weights(("w", 2))  # other weights: emptied
    assert cache.take([3] * 21) is None and cache.nbytes == 0


def test_close_fails_the_pending_requests_and_returns(sharp, engines):
    model, tok, prompts = sharp
    gate = Gate(model)
    engine = engines(gate, tok, set(), max_batch=1)
    running = engine.submit(prompts[0], replace(GREEDY, max_new_tokens=10))
    assert gate.entered.wait(WAIT_S)
    queued = [engine.submit(p, GREEDY) for p in prompts[1:3]]
    closer = threading.Thread(target=engine.close)
    closer.start()
    _wait_until(lambda: engine.closed)
    for future in queued:  # failed at once
        with pytest.raises(EngineClosedError):
            _result(future)
    gate.opened.set()  # the step in flight ends; then the worker stops
    closer.join(WAIT_S)
    assert not closer.is_alive()
    with pytest.raises(EngineClosedError):
        _result(running)
    engine.close()  # idempotent
    with pytest.raises(EngineClosedError):
        engine.submit(prompts[0], GREEDY)


def test_agenerate_serves_concurrent_tasks(sharp):
    model, tok, prompts = sharp
    policy = TransformersPolicy(model, tok, generation_dtype=None, max_batch=4)
    chosen = [prompts[0], prompts[3], prompts[4]]

    async def play():
        return await asyncio.gather(*(policy.agenerate(p, GREEDY) for p in chosen))

    try:
        completions = asyncio.run(play())
        for prompt, completion in zip(chosen, completions, strict=True):
            ref = policy.generate([prompt], GREEDY)[0]
            assert completion.token_ids == ref.token_ids
            assert completion.text == ref.text and completion.finish_reason == ref.finish_reason
            assert torch.allclose(
                torch.tensor(completion.logprobs), torch.tensor(ref.logprobs), atol=1e-4
            )
        stats = policy.engine_stats()
        assert stats["generated_tokens"] == sum(len(c.token_ids) for c in completions)
    finally:
        policy.close()
    with pytest.raises(EngineClosedError):
        asyncio.run(policy.agenerate(prompts[0], GREEDY))


def _held_bytes(policy: TransformersPolicy) -> int:
    return sum(p.numel() * p.element_size() for p in policy._gen_model.parameters())


def test_a_transient_copy_holds_weights_only_while_the_engine_is_busy(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    bf16 = torch.bfloat16
    transient = TransformersPolicy(model, tok, generation_dtype=bf16, transient_copy=True)
    lasting = TransformersPolicy(model, tok, generation_dtype=bf16)
    prompt = transient.encode_chat([{"role": "user", "content": "count to five"}])
    try:
        completion = asyncio.run(transient.agenerate(prompt, GREEDY))
        assert completion.token_ids == lasting.generate([prompt], GREEDY)[0].token_ids
        _wait_until(lambda: _held_bytes(transient) == 0)  # freed once the engine idles
    finally:
        transient.close()


def test_weights_staged_during_a_step_load_before_the_next_and_empty_the_cache(tiny):
    model, tok = tiny
    own = copy.deepcopy(model)
    policy = TransformersPolicy(
        own, tok, generation_dtype=None, separate_copy=True, prefix_cache_mb=64
    )
    prompt = policy.encode_chat([{"role": "user", "content": "count to five"}])
    gen = torch.Generator().manual_seed(0)
    changed = {
        k: v.detach() + 0.05 * torch.randn(v.shape, generator=gen)
        for k, v in model.named_parameters()
    }
    try:
        first = asyncio.run(policy.agenerate(prompt, GREEDY))
        with policy._lock:  # as if the engine were in a step: the update is staged
            policy.update_weights(changed)
        assert policy._staged is not None and policy.version == 0
        second = _next_turn(tok, prompt, SampledRow(list(first.token_ids)))
        completion = asyncio.run(policy.agenerate(second, GREEDY))
        assert policy._staged is None and policy.version == 1
        assert policy.engine_stats()["reused_tokens"] == 0  # the old weights' keys: dropped
        fresh = copy.deepcopy(model)
        fresh.load_state_dict(changed, strict=False)
        ref = TransformersPolicy(fresh, tok, generation_dtype=None).generate([second], GREEDY)[0]
        assert completion.token_ids == ref.token_ids
    finally:
        policy.close()
