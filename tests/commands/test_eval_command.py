"""`rldojo eval` end to end on the tiny model and on a stand-in OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import re
import threading
from http.server import HTTPServer
from typing import ClassVar

import pytest
from chat_stub import ChatStub
from typer.testing import CliRunner

from rldojo.cli import app

runner = CliRunner()


def test_eval_samples_compare_perturb_noise_and_report(tmp_path):
    errors = tmp_path / "errors.jsonl"
    errors.write_text(json.dumps({"task_id": "arith-v1/test/0/0", "mislabeled": True}) + "\n")
    out, report = tmp_path / "eval.json", tmp_path / "eval.md"
    args = [
        "eval", "--model", "tiny-random", "--tasks", "3", "--max-new-tokens", "3",
        "--samples", "2", "--compare", "tiny-random", "--perturb", "template=qa",
        "--label-errors", str(errors), "--bootstrap", "200", "--out", str(out),
        "--report", str(report),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["samples"] == 2 and data["temperature"] == 0.7
    assert {"pass@1", "pass@2", "avg@2", "maj@2", "reward"} == set(data["metrics"])
    assert data["metrics"]["pass@1"]["tasks"] == 3 and len(data["rows"]) == 3
    assert data["compare"]["tasks"] == 3 and "mcnemar" in data["compare"]
    assert set(data["robustness"]["variants"]) == {"baseline", "template=qa"}
    assert data["noise"]["ceiling"] == pytest.approx(2 / 3)
    assert any(f["cause"] == "component:format=0" for f in data["failures"])
    text = report.read_text()
    assert "| pass@1 |" in text and "## Robustness" in text
    assert "## Failure modes: tiny-random" in text and text.count("## Failure modes") == 2
    assert (tmp_path / "eval_robustness.png").exists()


def test_eval_bad_input_is_one_line():
    result = runner.invoke(app, ["eval", "--env", "nope-v1"])
    assert result.exit_code == 2 and "unknown environment 'nope-v1'" in result.output
    result = runner.invoke(app, ["eval", "--perturb", "labels=numbers", "--model", "tiny-random",
                                 "--tasks", "1", "--max-new-tokens", "1"])  # fmt: skip
    assert result.exit_code == 2 and "unknown perturbation" in result.output


class _Stub(ChatStub):
    seen: ClassVar[list[dict]] = []

    def answer(self, body):
        a, b = re.search(r"What is (\d+) \+ (\d+)\?", body["messages"][-1]["content"]).groups()
        return f"Answer: {int(a) + int(b)}"


def test_eval_against_an_openai_compatible_endpoint(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1#stub"
        out = tmp_path / "e.json"
        result = runner.invoke(app, ["eval", "--model", url, "--tasks", "5", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert json.loads(out.read_text())["accuracy"] == 1.0
    finally:
        server.shutdown()
        server.server_close()


class _ToolCaller(ChatStub):
    """Answers every request with a calculator call, so an episode ends only at its turn
    limit; `seen` counts the requests."""

    seen: ClassVar[list[dict]] = []

    def answer(self, body):
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>'


@pytest.mark.parametrize("max_turns", [2, 3])
def test_eval_max_turns_bounds_each_episode(tmp_path, max_turns):
    _ToolCaller.seen.clear()
    server = HTTPServer(("127.0.0.1", 0), _ToolCaller)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "e.json"
        args = [
            "eval", "--model", f"http://127.0.0.1:{server.server_port}/v1#stub",
            "--env", "arith-tools-v1", "--env-kwargs", '{"python": "off"}', "--tasks", "2",
            "--max-turns", str(max_turns), "--out", str(out),
        ]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert len(_ToolCaller.seen) == 2 * max_turns  # every episode cut at its limit
        data = json.loads(out.read_text())
        assert data["accuracy"] == 0.0
        # --out keeps each sample's whole episode: every call and the calculator's result
        assert [r["task_id"] for r in data["records"]] == [r["task_id"] for r in data["rows"]]
        for record in data["records"]:  # the call of the last turn is cut, not run
            roles = [m["role"] for m in record["turns"]]
            assert roles == ["assistant", "tool"] * (max_turns - 1) + ["assistant"]
            results = [m["content"] for m in record["turns"] if m["role"] == "tool"]
            assert all('"result": "6"' in c for c in results)
            assert record["turns"][-1]["content"] == record["completion"]
    finally:
        server.shutdown()
        server.server_close()


def test_eval_max_turns_must_be_positive():
    result = runner.invoke(app, ["eval", "--max-turns", "0"])
    assert result.exit_code != 0 and "--max-turns must be >= 1" in result.output
