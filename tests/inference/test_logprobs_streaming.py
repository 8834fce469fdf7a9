"""`logprobs` and `stream: true` of `rldojo serve`, through the real openai client on loopback.

The real engine (`tiny-random`, float32) and the scripted stand-in both; the wire format
of the stream is also read raw with httpx.
"""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import openai
import pytest
import torch
from judge_standin import StandinJudge

from rldojo.inference import ScriptedEngine, start_server
from rldojo.inference.engine import ChatRequest
from rldojo.inference.logprobs import token_pieces, word_pieces

pytestmark = pytest.mark.slow  # rldojo serve over tiny-random

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def _ask(client, **kw):
    return client.chat.completions.create(**({"model": "tiny-random", "messages": QUESTION} | kw))


def _check_logprobs(choice, completion_tokens, k):
    """One entry per token, joining to the content, each with k sorted alternatives."""
    entries = choice.logprobs.content
    assert len(entries) == completion_tokens
    assert "".join(e.token for e in entries) == choice.message.content
    for e in entries:
        assert e.logprob <= 0.0
        assert e.bytes == list(e.token.encode("utf-8"))
        assert len(e.top_logprobs) == k
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0.0 for v in values)


def test_greedy_logprobs_per_token_with_top_alternatives(client):
    r = _ask(client, max_tokens=12, temperature=0.0, logprobs=True, top_logprobs=5)
    choice = r.choices[0]
    _check_logprobs(choice, r.usage.completion_tokens, 5)
    for e in choice.logprobs.content:  # greedy picks the most likely token
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-5)
        assert e.logprob == pytest.approx(max(t.logprob for t in e.top_logprobs), abs=1e-5)


def test_logprobs_are_the_raw_model_distribution(server, client):
    r = _ask(client, max_tokens=4, temperature=0.5, seed=1, logprobs=True, top_logprobs=5)
    _check_logprobs(r.choices[0], r.usage.completion_tokens, 5)
    engine = server.engine
    prompt = engine.policy.encode_chat(QUESTION)
    with torch.no_grad():
        logits = engine._gen_model(input_ids=torch.tensor([prompt])).logits[0, -1]  # [V]
    raw = torch.log_softmax(logits.float(), -1).topk(5).values.tolist()
    first = [t.logprob for t in r.choices[0].logprobs.content[0].top_logprobs]
    assert first == pytest.approx(raw, abs=1e-4)  # before temperature, as vLLM by default
    tempered = torch.log_softmax(logits.float() / 0.5, -1).topk(5).values.tolist()
    assert first != pytest.approx(tempered, abs=1e-4)


def test_logprobs_without_top_and_absent_unless_asked(client):
    r = _ask(client, max_tokens=6, temperature=1.0, seed=4, n=2, logprobs=True)
    for choice in r.choices:
        _check_logprobs(choice, len(choice.logprobs.content), 0)
    assert sum(len(c.logprobs.content) for c in r.choices) == r.usage.completion_tokens
    plain = _ask(client, max_tokens=3, temperature=0.0)
    assert plain.choices[0].logprobs is None


def test_invalid_logprobs_and_stream_options_are_400(client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        _ask(client, max_tokens=2, top_logprobs=3)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        _ask(client, max_tokens=2, logprobs=True, top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        _ask(client, max_tokens=2, stream_options={"include_usage": True})
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _ask(client, model="gpt-nothing", stream=True)


def test_stream_matches_the_greedy_reply(client):
    whole = _ask(client, max_tokens=16, temperature=0.0)
    chunks = list(_ask(client, max_tokens=16, temperature=0.0, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (
        whole.choices[0].message.content
    )
    # one chunk per token after the role chunk; the last token's chunk says why it ended
    assert len(chunks) == 1 + whole.usage.completion_tokens
    assert chunks[-1].choices[0].delta.content is not None
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)


def test_stream_include_usage_adds_a_last_usage_chunk(client):
    whole = _ask(client, max_tokens=10, temperature=0.0)
    chunks = list(
        _ask(
            client,
            max_tokens=10,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(last.usage, k) for k in counts] == [getattr(whole.usage, k) for k in counts]
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stream_n2_with_logprobs_matches_the_whole_reply(client):
    args = {"max_tokens": 8, "temperature": 1.0, "seed": 21, "n": 2, "logprobs": True}
    whole = _ask(client, top_logprobs=2, **args)
    chunks = list(_ask(client, top_logprobs=2, stream=True, **args))
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == choice.index]
        assert mine[0].delta.role == "assistant"
        assert "".join(p.delta.content or "" for p in mine) == choice.message.content
        assert mine[-1].finish_reason == choice.finish_reason
        streamed = [e for p in mine if p.logprobs for e in p.logprobs.content]
        assert [e.token for e in streamed] == [e.token for e in choice.logprobs.content]
        assert [e.logprob for e in streamed] == pytest.approx(
            [e.logprob for e in choice.logprobs.content], abs=1e-5
        )
        assert all(len(e.top_logprobs) == 2 for e in streamed)


def test_stream_wire_format(server):
    body = {
        "model": "tiny-random",
        "messages": QUESTION,
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""  # every event ends with a blank line
    events = events[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_batched_requests_get_their_own_logprobs(server, monkeypatch):
    engine = server.engine
    generate = engine._generate
    mixes: list[set[bool]] = []

    def held(batch):
        # The first decode waits until all four requests are queued, so at least one
        # decode holds two or more of them: requests are submitted in order, and they
        # alternate with and without logprobs.
        if not mixes:
            queue = engine.queue
            with queue.cond:
                arrived = queue.cond.wait_for(lambda: len(batch) + len(queue.jobs) >= 4, 120)
            assert arrived, "the four requests never all arrived"
        mixes.append({job.top_logprobs is None for job in batch})
        generate(batch)

    monkeypatch.setattr(engine, "_generate", held)
    tops = [None, 3, None, 1]

    async def four():
        requests = [
            ChatRequest(
                messages=[{"role": "user", "content": f"Count to {i}"}],
                max_tokens=5,
                temperature=0.0,
                logprobs=top is not None,
                top_logprobs=top or 0,
            )
            for i, top in enumerate(tops)
        ]
        return await asyncio.gather(*(engine.chat(r) for r in requests))

    results = asyncio.run(four())
    assert {True, False} in mixes  # one decode batched requests with and without logprobs
    for top, result in zip(tops, results, strict=True):
        choice = result.choices[0]
        assert "".join(choice.pieces) == choice.text
        assert len(choice.pieces) == choice.completion_tokens
        if top is None:
            assert choice.logprobs is None
            continue
        assert len(choice.logprobs) == choice.completion_tokens
        for entry in choice.logprobs:
            assert len(entry.top) == top
            assert entry.logprob == pytest.approx(entry.top[0][1], abs=1e-5)


def test_scripted_engine_logprobs_and_stream():
    engine = ScriptedEngine(lambda req: "two words " if req.n == 1 else "", model="m")
    with start_server(engine) as handle:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0)
        ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        r = client.chat.completions.create(**ask, logprobs=True, top_logprobs=3)
        chunks = list(client.chat.completions.create(**ask, stream=True, logprobs=True))
        empty = list(client.chat.completions.create(**ask, n=2, stream=True))
    entries = r.choices[0].logprobs.content
    assert [e.token for e in entries] == ["two", " words "]
    assert r.usage.completion_tokens == 2
    for e in entries:
        assert e.logprob == pytest.approx(-math.log(2))
        assert [t.token for t in e.top_logprobs] == [e.token, "alt1", "alt2"]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(
            [-math.log(2), -math.log(2) - 1, -math.log(2) - 2]
        )
    assert [c.choices[0].delta.content for c in chunks] == ["", "two", " words "]
    assert [c.choices[0].logprobs.content[0].top_logprobs for c in chunks[1:]] == [[], []]
    assert chunks[-1].choices[0].finish_reason == "stop"
    # an empty reply: role chunk, then a finish chunk with an empty delta, per choice
    assert [(c.choices[0].index, c.choices[0].finish_reason) for c in empty] == [
        (0, None),
        (1, None),
        (0, "stop"),
        (1, "stop"),
    ]
    assert engine.calls == 3


def test_standin_judge_streams_its_verdict():
    engine = ScriptedEngine(StandinJudge())
    with start_server(engine) as handle:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0)
        ask = {"model": engine.model, "messages": [{"role": "user", "content": "grade"}]}
        whole = client.chat.completions.create(**ask).choices[0].message.content
        chunks = list(client.chat.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_token_pieces_join_to_the_content(tiny):
    _, tokenizer = tiny
    text = "Hi wörld 🎉 日本語  x"
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    pieces = token_pieces(tokenizer, ids, text)
    assert len(pieces) == len(ids) and "".join(pieces) == text
    assert pieces[-1] == ""  # EOS adds no text
    assert "" in pieces[:-1]  # a character split over tokens belongs to its last token
    cut = text[: text.index("日")]  # a stop string cuts the content, and the pieces
    assert "".join(token_pieces(tokenizer, ids, cut)) == cut
    assert word_pieces("  two words ") == ("  two", " words ")
    assert word_pieces("") == () and word_pieces(" ") == (" ",)
