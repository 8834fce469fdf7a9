"""`stream: true` sends each token as it is sampled, not after the reply is done.

The proof needs no clock: a hook on the sampler's per-step callback holds the decode
loop after its first token until the client has read that token's chunk. If the server
sent nothing before generation ended, the client could never read it while the loop is
held: the hook's wait would time out and the test fail. Also: a stop string is never
sent, even when the stream has already sent the text before it; a failure midway ends
the stream with an error event the openai SDK raises.
"""

from __future__ import annotations

import threading

import openai
import pytest

pytestmark = pytest.mark.slow  # rldojo serve over tiny-random

ASK = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _hold_after_first_step(monkeypatch, engine, on_first_step):
    """Wrap the engine's sampler so `on_first_step(step)` runs on the sampling thread
    right after the first decode step has been handed to the server."""
    generate = engine.policy.generate
    steps = []

    def held(prompts, sampling, *, on_step=None):
        def hook(step):
            if on_step is not None:
                on_step(step)  # the server's own: the token leaves for the client
            steps.append(step)
            if len(steps) == 1:
                on_first_step(step)

        return generate(prompts, sampling, on_step=hook)

    monkeypatch.setattr(engine.policy, "generate", held)
    return steps


def test_the_first_chunk_arrives_while_generation_is_running(server, client, monkeypatch):
    first_read = threading.Event()
    seen: dict[str, object] = {}

    def wait_for_the_client(step):
        seen["finished"] = list(step.finished)  # did this step end the reply? (None: no)
        seen["read"] = first_read.wait(timeout=120)

    steps = _hold_after_first_step(monkeypatch, server.engine, wait_for_the_client)
    args = {"model": "tiny-random", "messages": ASK, "max_tokens": 8, "temperature": 0.0}
    chunks = []
    for chunk in client.chat.completions.create(**args, stream=True):
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.role is None:
            first_read.set()  # a token's chunk (the role chunk comes first)
    assert seen["finished"] == [None]  # the decode loop was mid-reply when it waited
    assert seen["read"] is True  # ... and the client read the first token meanwhile
    assert len(steps) > 1
    monkeypatch.undo()
    whole = client.chat.completions.create(**args)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content


def test_a_stop_string_is_never_sent(client):
    args = {"model": "tiny-random", "messages": ASK, "max_tokens": 16, "temperature": 0.0}
    whole = client.chat.completions.create(**args).choices[0].message.content
    assert len(whole) > 6
    stop = whole[3:6]  # reached after some tokens were sampled
    cut = client.chat.completions.create(**args, stop=[stop]).choices[0].message.content
    streamed = client.chat.completions.create(**args, stop=[stop], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed)
    assert text == cut == whole[: whole.index(stop)]


def test_a_failure_midway_ends_the_stream_with_an_error(server, client, monkeypatch):
    def fail(step):
        raise RuntimeError("the accelerator fell over")

    _hold_after_first_step(monkeypatch, server.engine, fail)
    args = {"model": "tiny-random", "messages": ASK, "max_tokens": 8, "temperature": 0.0}
    received = []
    with pytest.raises(openai.APIError, match="fell over"):
        for chunk in client.chat.completions.create(**args, stream=True):
            received.append(chunk)
    assert len(received) >= 2  # the role chunk and the first token went out first
    monkeypatch.undo()
    after = client.chat.completions.create(**args)  # the engine keeps serving
    assert after.choices[0].finish_reason in ("stop", "length")
