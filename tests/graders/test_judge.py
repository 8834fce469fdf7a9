"""Judge backends: retries with backoff, per-call timeout, concurrency limit, the SQLite
cache (re-asking costs nothing), in-flight sharing, provenance, the in-process judge."""

from __future__ import annotations

import asyncio
import threading

import pytest
from judge_standin import StandinJudge

from rldojo.graders import (
    Criterion,
    EngineJudge,
    JudgeCache,
    JudgeClient,
    JudgeError,
    JudgeRequest,
    JudgeTimeout,
    OpenAIJudge,
    RubricGrader,
)
from rldojo.inference import ScriptedEngine, start_server
from rldojo.inference.engine import ChatChoice, ChatResult, TransformersEngine
from rldojo.types import Rollout, Task

REQUEST = JudgeRequest([{"role": "user", "content": "Is 12 right?"}])


def flaky(failures: int):
    """A reply function that raises (HTTP 500) `failures` times, then answers."""
    state = {"left": failures}

    def reply(request):
        if state["left"] > 0:
            state["left"] -= 1
            raise RuntimeError("overloaded")
        return "fine"

    return reply


def test_retries_transport_errors_with_backoff():
    engine = ScriptedEngine(flaky(2))
    with start_server(engine) as server:
        judge = OpenAIJudge(server.url, server.model, max_retries=2, backoff_s=0.01)
        assert asyncio.run(judge.complete(REQUEST)) == "fine"
    assert engine.calls == 3


def test_gives_up_after_retries():
    engine = ScriptedEngine(flaky(5))
    with start_server(engine) as server:
        judge = OpenAIJudge(server.url, server.model, max_retries=1, backoff_s=0.01)
        with pytest.raises(JudgeError, match="after 2 attempts"):
            asyncio.run(judge.complete(REQUEST))
    assert engine.calls == 2


def test_client_errors_are_not_retried():
    engine = ScriptedEngine(lambda r: "x", model="real-name")
    with start_server(engine) as server:
        judge = OpenAIJudge(server.url, "wrong-name", max_retries=3, backoff_s=0.01)
        with pytest.raises(JudgeError, match="refused"):
            asyncio.run(judge.complete(REQUEST))
    assert engine.calls == 0  # 404 before the engine; no retries either


class HeldEngine(ScriptedEngine):
    """Answers no request until `release` is set (then as `ScriptedEngine`)."""

    def __init__(self, reply) -> None:
        super().__init__(reply)
        self.release = threading.Event()

    async def chat(self, request):
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return await super().chat(request)


class PairedEngine(ScriptedEngine):
    """Holds each request until the next one has arrived too (requests 0 and 1, 2 and 3,
    ...; at most a minute): two requests in flight at once overlap here for sure."""

    async def chat(self, request):
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(self.requests) < index // 2 * 2 + 2 and loop.time() < deadline:
                await asyncio.sleep(0.01)
            text = self.reply(request)
        finally:
            with self._lock:
                self.in_flight -= 1
        return ChatResult(choices=[ChatChoice(text, "stop", 1)] * request.n, prompt_tokens=1)


@pytest.mark.slow
def test_per_call_timeout():
    engine = HeldEngine(lambda r: "late")  # no reply comes until after the timeouts
    with start_server(engine) as server:
        try:
            judge = OpenAIJudge(server.url, server.model, timeout_s=0.3, max_retries=1,
                                backoff_s=0.01)  # fmt: skip
            with pytest.raises(JudgeTimeout, match="timed out after 2 attempts"):
                asyncio.run(judge.complete(REQUEST))
        finally:
            engine.release.set()  # the held requests end, so the server stops at once


@pytest.mark.slow
def test_concurrency_limit():
    engine = PairedEngine(lambda r: "ok")
    with start_server(engine) as server:
        judge = OpenAIJudge(server.url, server.model, concurrency=2)

        async def many():
            requests = [JudgeRequest([{"role": "user", "content": str(i)}]) for i in range(6)]
            return await asyncio.gather(*(judge.complete(r) for r in requests))

        assert asyncio.run(many()) == ["ok"] * 6
    assert engine.max_in_flight == 2


@pytest.mark.slow
def test_cache_makes_asking_again_free(tmp_path):
    engine = ScriptedEngine(lambda r: f"verdict {r.seed}")
    with start_server(engine) as server:
        backend = OpenAIJudge(server.url, server.model)
        client = JudgeClient(backend, JudgeCache(tmp_path / "judge.sqlite"))
        first = asyncio.run(client.complete(REQUEST, template_hash="t1"))
        again = asyncio.run(client.complete(REQUEST, template_hash="t1"))
        assert (first.cached, again.cached, again.text) == (False, True, "verdict 0")
        assert engine.calls == 1
        # anything that changes the reply changes the key: template, seed, sampling
        asyncio.run(client.complete(REQUEST, template_hash="t2"))
        other_seed = JudgeRequest(REQUEST.messages, seed=1)
        assert asyncio.run(client.complete(other_seed, template_hash="t1")).text == "verdict 1"
        asyncio.run(
            client.complete(JudgeRequest(REQUEST.messages, temperature=0.5), template_hash="t1")
        )
        assert engine.calls == 4
        client.cache.close()
        # persistent: a new process (new cache object) still hits
        reopened = JudgeClient(
            OpenAIJudge(server.url, server.model), JudgeCache(tmp_path / "judge.sqlite")
        )
        assert asyncio.run(reopened.complete(REQUEST, template_hash="t1")).cached
    assert engine.calls == 4
    assert (reopened.stats.calls, reopened.stats.cache_hits, reopened.stats.hit_rate) == (0, 1, 1.0)


@pytest.mark.slow
def test_failures_are_not_cached(tmp_path):
    engine = ScriptedEngine(flaky(1))
    with start_server(engine) as server:
        client = JudgeClient(
            OpenAIJudge(server.url, server.model, max_retries=0), JudgeCache(tmp_path / "c.sqlite")
        )
        with pytest.raises(JudgeError):
            asyncio.run(client.complete(REQUEST, template_hash="t"))
        assert asyncio.run(client.complete(REQUEST, template_hash="t")).text == "fine"
    assert client.stats.failures == 1 and client.stats.calls == 2


def test_identical_requests_in_flight_share_one_call():
    engine = ScriptedEngine(lambda r: "shared", delay_s=0.2)
    client = JudgeClient(EngineJudge(engine))

    async def twice():
        return await asyncio.gather(
            client.complete(REQUEST, template_hash="t"), client.complete(REQUEST, template_hash="t")
        )

    replies = asyncio.run(twice())
    assert [r.text for r in replies] == ["shared", "shared"]
    assert engine.calls == 1 and client.stats.cache_hits == 1


def test_provenance_names_model_template_sampling_and_seed():
    client = JudgeClient(EngineJudge(ScriptedEngine(lambda r: "x", model="judge-7b")))
    request = JudgeRequest(REQUEST.messages, temperature=0.3, top_p=0.9, max_tokens=99, seed=5)
    prov = client.provenance(request, "abc")
    assert prov == {
        "judge_model": "judge-7b",
        "judge_backend": "in-process",
        "template_hash": "abc",
        "sampling": {"temperature": 0.3, "top_p": 0.9, "max_tokens": 99},
        "seed": 5,
    }


@pytest.mark.slow  # loads tiny-random
def test_in_process_transformers_judge_garbage_is_invalid_never_zero(tiny):
    model, tokenizer = tiny
    engine = TransformersEngine("tiny-random", model=model, tokenizer=tokenizer, dtype="float32")
    grader = RubricGrader(
        JudgeClient(EngineJudge(engine)), [Criterion("c", 'says "12"', 1)], max_tokens=8
    )
    rollout = Rollout(task_id="t", env="e", messages=[], completion="12")
    try:
        score = asyncio.run(grader.grade(rollout, Task(id="t", prompt="7+5?")))
    finally:
        engine.close()
    assert score.status == "invalid" and score.value is None
    assert score.provenance["attempts"] == 2  # one repair turn, then give up
    assert score.provenance["judge_model"] == "tiny-random"


def test_standin_engine_in_process():
    client = JudgeClient(EngineJudge(ScriptedEngine(StandinJudge())))
    grader = RubricGrader(client, [Criterion("c", 'says "12"', 2), Criterion("d", 'says "13"', -1)])
    rollout = Rollout(task_id="t", env="e", messages=[], completion="12 or 13")
    score = asyncio.run(grader.grade(rollout, Task(id="t", prompt="7+5?")))
    assert score.value == pytest.approx((2 - 1) / 2)


@pytest.mark.slow  # loads tiny-random
def test_transformers_backend_from_a_spec():
    from rldojo.graders import load

    spec = {
        "type": "rubric",
        "judge": {"backend": "transformers", "model": "tiny-random", "dtype": "float32"},
        "criteria": [{"id": "c", "text": "anything", "points": 1}],
        "sampling_params": {"max_tokens": 4},
    }

    async def run():
        grader = load(spec, cache=False)
        try:
            rollout = Rollout(task_id="t", env="e", messages=[], completion="12")
            return await grader.grade(rollout, Task(id="t", prompt="7+5?"))
        finally:
            await grader.close()

    score = asyncio.run(run())
    assert score.status == "invalid" and score.provenance["judge_backend"] == "in-process"
