"""`rldojo serve`'s request log: one line per request with method, path, status, model,
token counts and duration, written when the reply has been sent (a stream's too)."""

from __future__ import annotations

import re
import threading

import httpx
import openai
import pytest

from rldojo.inference import ScriptedEngine, start_server

pytestmark = pytest.mark.slow  # starts a server

ASK = [{"role": "user", "content": "how are you"}]
LINE = re.compile(
    r"^(?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3}) model=(?P<model>\S+) "
    r"prompt_tokens=(?P<prompt>\d+|-) completion_tokens=(?P<completion>\d+|-) "
    r"(?P<seconds>\d+\.\d{3})s$"
)


class Lines:
    """The log lines the server wrote, as they come (from the server's thread)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, line: str) -> None:
        with self._changed:
            self.lines.append(line)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[dict[str, str]]:
        """The first `count` lines, parsed; fails if they do not come within `timeout_s`."""
        with self._changed:
            done = self._changed.wait_for(lambda: len(self.lines) >= count, timeout_s)
            assert done, f"expected {count} log lines, got {self.lines}"
            parsed = [LINE.match(line) for line in self.lines[:count]]
        assert all(parsed), self.lines
        return [m.groupdict() for m in parsed if m]


@pytest.fixture
def logged():
    lines = Lines()
    engine = ScriptedEngine(lambda req: "fine thanks and you", model="m")
    with start_server(engine, request_log=lines) as handle:
        yield openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0), handle, lines


def test_a_line_per_request_with_its_usage(logged):
    client, _, lines = logged
    chat = client.chat.completions.create(model="m", messages=ASK)
    text = client.completions.create(model="m", prompt="say it", max_tokens=8)
    [first, second] = lines.wait_for(2)
    assert first | {"seconds": ""} == {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": "200",
        "model": "m",
        "prompt": str(chat.usage.prompt_tokens),
        "completion": str(chat.usage.completion_tokens),
        "seconds": "",
    }
    assert (second["path"], second["prompt"], second["completion"]) == (
        "/v1/completions",
        str(text.usage.prompt_tokens),
        str(text.usage.completion_tokens),
    )
    assert 0 <= float(first["seconds"]) < 30


def test_a_stream_is_logged_when_it_ends_with_its_token_count(logged):
    client, _, lines = logged
    chunks = list(
        client.chat.completions.create(
            model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
    )
    [line] = lines.wait_for(1)
    assert (line["status"], line["completion"]) == ("200", str(chunks[-1].usage.completion_tokens))
    assert line["prompt"] == str(chunks[-1].usage.prompt_tokens)


def test_errors_are_logged_and_health_is_not(logged):
    client, handle, lines = logged
    assert httpx.get(handle.url.removesuffix("/v1") + "/health").status_code == 200
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=ASK, temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-x", messages=ASK)
    client.models.list()
    bad, wrong, models = lines.wait_for(3)
    assert (bad["status"], bad["model"], bad["prompt"]) == ("400", "-", "-")
    assert (wrong["status"], wrong["model"], wrong["completion"]) == ("404", "gpt-x", "-")
    assert (models["method"], models["path"], models["status"]) == ("GET", "/v1/models", "200")
    assert len(lines.lines) == 3  # /health was answered first: had it been logged, it would lead
