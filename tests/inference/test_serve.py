"""`rldojo serve`: the real openai client against the server on loopback (tiny model)."""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import openai
import pytest

from rldojo.inference import ScriptedEngine, start_server
from rldojo.inference.engine import ChatRequest

pytestmark = pytest.mark.slow  # rldojo serve over tiny-random


def _ask(client, **kw):
    args = {"model": "tiny-random", "messages": [{"role": "user", "content": "What is 2+2?"}]}
    return client.chat.completions.create(**(args | kw))


def test_binds_loopback_and_lists_the_model(server, client):
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/v1"
    assert [m.id for m in client.models.list().data] == ["tiny-random"]


def test_chat_completion_with_usage_and_n(client):
    r = _ask(client, max_tokens=6, temperature=0.0, n=2)
    assert len(r.choices) == 2
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # greedy: both choices are the same text
    assert r.choices[0].message.content == r.choices[1].message.content


def test_seeded_sampling_is_reproducible(client):
    a = _ask(client, max_tokens=8, temperature=1.0, seed=7).choices[0].message.content
    b = _ask(client, max_tokens=8, temperature=1.0, seed=7).choices[0].message.content
    assert a == b


def test_max_tokens_gives_length_finish(client):
    r = _ask(client, max_tokens=1, temperature=1.0, seed=3)
    assert r.usage.completion_tokens == 1
    assert r.choices[0].finish_reason in ("length", "stop")


def test_errors_have_openai_shape(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _ask(client, model="gpt-nothing")
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny-random", messages=[])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        _ask(client, temperature=5.0)


def test_max_tokens_beyond_the_context_is_invalid_value_naming_the_limit(client):
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as err:
            _ask(client, **{field: 10**6})
        body = err.value.body
        assert (body["type"], body["param"], body["code"]) == (
            "invalid_request_error",
            field,
            "invalid_value",
        )
        assert "1000000 is too large" in body["message"] and "2048" in body["message"]
    with pytest.raises(openai.BadRequestError) as err:  # fits alone, not with the prompt
        _ask(client, max_completion_tokens=2040)
    body = err.value.body
    assert (body["param"], body["code"]) == ("max_completion_tokens", "context_length_exceeded")


_DROP = object()


@pytest.mark.parametrize(
    ("change", "param", "code"),  # OpenAI's codes for the same faults
    [
        ({"temperature": 5}, "temperature", "decimal_above_max_value"),
        ({"top_p": 0}, "top_p", "decimal_below_min_value"),
        ({"n": 0}, "n", "integer_below_min_value"),
        ({"n": 17}, "n", "integer_above_max_value"),
        ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", "integer_above_max_value"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
        ({"messages": []}, "messages", "empty_array"),
        ({"messages": _DROP}, "messages", "missing_required_parameter"),
        ({"temperature": "hot"}, "temperature", "invalid_type"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role", "missing_required_parameter"),
        ({"tool_choice": "required"}, "tool_choice", "unsupported_value"),
    ],
)
def test_invalid_fields_are_400s_with_openai_param_and_code(server, change, param, code):
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]} | change
    body = {k: v for k, v in body.items() if v is not _DROP}
    reply = httpx.post(f"{server.url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code) and param in error["message"]


def test_a_body_that_is_no_object_is_a_400_naming_the_body(server):
    reply = httpx.post(f"{server.url}/chat/completions", json=["hi"], timeout=60)
    error = reply.json()["error"]
    assert reply.status_code == 400 and (error["param"], error["code"]) == (None, "invalid_type")
    assert error["message"].startswith("the request body: ")


def test_embeddings_float_and_base64(client):
    default = client.embeddings.create(model="tiny-random", input=["hello", "world"])
    floats = client.embeddings.create(
        model="tiny-random", input=["hello", "world"], encoding_format="float"
    )
    assert [d.index for d in default.data] == [0, 1]
    for a, b in zip(default.data, floats.data, strict=True):
        assert len(a.embedding) == 64  # tiny-random's hidden size
        assert math.isclose(sum(x * x for x in a.embedding), 1.0, rel_tol=1e-4)
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)


def test_concurrent_requests_are_batched(server, monkeypatch):
    engine = server.engine
    generate = engine._generate
    decodes: list[int] = []

    def held(batch):
        # However the six requests arrive (a loaded machine may space them out), the
        # first decode waits until all are in: the rest then wait in the queue together.
        deadline = time.monotonic() + 120
        while not decodes and len(batch) + len(engine.queue.jobs) < 6:
            assert time.monotonic() < deadline, "the six requests never all arrived"
            time.sleep(0.01)
        decodes.append(len(batch))
        generate(batch)

    monkeypatch.setattr(engine, "_generate", held)

    async def many():
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        msgs = [[{"role": "user", "content": f"Count to {i}"}] for i in range(6)]
        replies = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="tiny-random", messages=m, max_tokens=4, temperature=0.0
                )
                for m in msgs
            )
        )
        await client.close()
        return replies

    before = len(server.engine.batches)
    replies = asyncio.run(many())
    assert len(replies) == 6
    assert max(server.engine.batches[before:]) > 1  # at least two requests shared a decode


def test_scripted_server_counts_requests():
    engine = ScriptedEngine(lambda req: f"echo: {req.messages[-1]['content']}", model="m")
    with start_server(engine) as handle:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], seed=3, temperature=0.2
        )
    assert r.choices[0].message.content == "echo: hi"
    assert engine.calls == 1
    request: ChatRequest = engine.requests[0]
    assert (request.seed, request.temperature) == (3, 0.2)


def test_stop_strings_cut_the_text(client):
    stops = ["e", "a", " "]
    r = _ask(client, max_tokens=16, temperature=1.0, seed=11, stop=stops)
    text = r.choices[0].message.content
    assert not any(s in text for s in stops)
