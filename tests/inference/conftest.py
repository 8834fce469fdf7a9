"""The server the inference tests talk to: `rldojo serve` over `tiny-random` in float32,
one per test module, and the real openai client on loopback pointed at it."""

from __future__ import annotations

import openai
import pytest

from rldojo.inference import start_server
from rldojo.inference.engine import TransformersEngine


@pytest.fixture(scope="module")
def server(tiny):
    model, tokenizer = tiny
    engine = TransformersEngine("tiny-random", model=model, tokenizer=tokenizer, dtype="float32")
    with start_server(engine) as handle:
        yield handle
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
