"""`rldojo serve` as a command: binds loopback, prints its URL, answers the openai client and
logs each request; `--max-model-len`, `--chat-template`, `--no-request-log`,
`--served-model-name` and the key from `RLDOJO_API_KEY`; bad options as one line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import openai
import pytest
import warm
from typer.testing import CliRunner

from rldojo.cli import app


class _Output:
    """A process's output lines as they come, read by a thread (a read never blocks the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._new = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._new:
                self.lines.append(line.rstrip("\n"))
                self._new.notify_all()

    def wait_for(self, pattern: str, timeout_s: float = 120.0) -> re.Match[str]:
        """The first line matching `pattern`; fails if none comes within `timeout_s` or
        the output ends first."""

        def found() -> re.Match[str] | None:
            return next((m for line in self.lines if (m := re.search(pattern, line))), None)

        with self._new:
            self._new.wait_for(lambda: found() or not self._thread.is_alive(), timeout_s)
            match = found()
        assert match is not None, f"no line matches {pattern!r} in {self.lines}"
        return match

    def close(self) -> list[str]:
        """Every line, once the process has exited."""
        self._thread.join(timeout=30)
        return self.lines


@contextlib.contextmanager
def _serving(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, _Output]]:
    """`rldojo serve --port 0 ARGS` (forked from a warm interpreter, tests/warm.py); yields
    the URL it prints and its output, stops it with SIGINT (Ctrl-C) after."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})}
    proc = warm.Popen(
        [sys.executable, "-m", "rldojo.cli", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output = _Output(proc)
    try:
        url = output.wait_for(r"serving \S+ at (http://127\.0\.0\.1:\d+/v1)").group(1)
        yield url, output
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        output.close()


TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.mark.slow  # a process that loads the model
def test_rldojo_serve_command(tmp_path, tiny):
    template = tmp_path / "plain.jinja"
    template.write_text(TEMPLATE)
    args = ("--model", "tiny-random", "--max-model-len", "128", "--chat-template", str(template))
    with _serving(*args) as (url, output):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="tiny-random",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            temperature=0,
        )
        assert reply.usage.completion_tokens <= 3
        rendered = tiny[1]("user: hi\nassistant:", add_special_tokens=False)["input_ids"]
        assert reply.usage.prompt_tokens == len(rendered)  # the template given, not the model's
        line = output.wait_for(r"^POST /v1/chat/completions 200 model=tiny-random (.*)$")
        usage = reply.usage
        assert line.group(1).startswith(
            f"prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
        )
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny-random", prompt="Hi", max_tokens=200)
        assert err.value.body["code"] == "invalid_value" and "128" in err.value.body["message"]


@pytest.mark.slow  # a process that loads the model
def test_served_name_and_key_from_the_environment():
    args = ("--model", "tiny-random", "--served-model-name", "tiny", "--no-request-log")
    with _serving(*args, env={"RLDOJO_API_KEY": "k3y"}) as (url, output):
        client = openai.OpenAI(base_url=url, api_key="k3y", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        text = client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert text.usage.completion_tokens <= 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="nope", max_retries=0).models.list()
    assert not [line for line in output.close() if "/v1/" in line and "serving" not in line]


@pytest.mark.slow  # imports the command (typer, transformers' template compiler)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--chat-template", "{% for m in messages %}"), "--chat-template: line 1: Unexpected end"),
        (("--chat-template", "missing.jinja"), "--chat-template: no file missing.jinja"),
        (("--max-model-len", "0"), "--max-model-len: must be at least 1"),
    ],
)
def test_bad_options_fail_in_one_line_before_anything_loads(args, message):
    result = CliRunner().invoke(app, ["serve", "--model", "no-such-model", *args])
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {message}")
