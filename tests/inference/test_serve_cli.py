"""`rldojo serve` as a command: binds loopback, prints its URL, answers the openai client;
`--served-model-name` and the key from `RLDOJO_API_KEY`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import openai
import pytest


@contextlib.contextmanager
def _serving(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`rldojo serve --port 0 ARGS` in a fresh interpreter; yields the URL it prints,
    stops it with SIGINT (Ctrl-C) after."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rldojo.cli", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = None
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            if m := re.search(r"serving \S+ at (http://127\.0\.0\.1:\d+/v1)", line):
                url = m.group(1)
        assert url is not None, "rldojo serve did not print its URL"
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow  # a fresh interpreter imports torch and loads the model: ~10 s
def test_rldojo_serve_command():
    with _serving("--model", "tiny-random") as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="tiny-random",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            temperature=0,
        )
        assert reply.usage.completion_tokens <= 3


@pytest.mark.slow  # a fresh interpreter imports torch and loads the model: ~10 s
def test_served_name_and_key_from_the_environment():
    args = ("--model", "tiny-random", "--served-model-name", "tiny")
    with _serving(*args, env={"RLDOJO_API_KEY": "k3y"}) as url:
        client = openai.OpenAI(base_url=url, api_key="k3y", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        text = client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert text.usage.completion_tokens <= 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="nope", max_retries=0).models.list()
