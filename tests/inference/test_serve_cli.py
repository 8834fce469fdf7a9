"""`rldojo serve` as a command: binds loopback, prints its URL, answers the openai client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import openai
import pytest


@pytest.mark.slow  # a fresh interpreter imports torch and loads the model: ~10 s
def test_rldojo_serve_command(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rldojo.cli", "serve", "--model", "tiny-random", "--port", "0"],
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
            if m := re.search(r"serving tiny-random at (http://127\.0\.0\.1:\d+/v1)", line):
                url = m.group(1)
        assert url is not None, "rldojo serve did not print its URL"
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="tiny-random",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            temperature=0,
        )
        assert reply.usage.completion_tokens <= 3
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
