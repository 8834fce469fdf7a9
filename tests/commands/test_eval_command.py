"""`rldojo eval` end to end on the tiny model and on a stand-in OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import re
import threading
from http.server import HTTPServer
from typing import ClassVar

import pytest
from chat_stub import ChatStub
from tiny_config import tiny_overrides
from typer.testing import CliRunner

import rldojo
from rldojo.api.runs import as_config, with_reward
from rldojo.cli import app
from rldojo.config import dump_config

pytestmark = pytest.mark.slow  # trains and evaluates tiny-random; an HTTP stand-in

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
    # each evaluation shows how far it got (3 tasks x 2 samples; a log: start and end)
    for label in ("tiny-random", "template=qa"):
        assert f"evaluating {label}: 0/6\n" in result.stdout
        assert f"evaluating {label}: 6/6\n" in result.stdout
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
        url = f"http://127.0.0.1:{server.server_port}/v1#stub"
        args = [
            "eval", "--model", url,
            "--env", "arith-tools-v1", "--env-kwargs", '{"python": "off"}', "--tasks", "2",
            "--max-turns", str(max_turns), "--out", str(out),
        ]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert len(_ToolCaller.seen) == 2 * max_turns  # every episode cut at its limit
        # progress per turn: "evaluating URL: 2/2", "evaluating URL, turn 2: 2/2", ...
        shown = [x for x in result.stdout.splitlines() if x.startswith("evaluating ")]
        ends = [
            f"evaluating {url}{f', turn {t}' if t > 1 else ''}: 2/2"
            for t in range(1, max_turns + 1)
        ]
        assert [x for x in shown if x.endswith(": 2/2")] == ends
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


TINY_RUN = tiny_overrides(
    "env.id=arith-v1", "env.kwargs={levels=[2]}", "eval.max_new_tokens=3",
    "rollout.max_turns=2", "run.steps=2", "run.checkpoint_every=1",
    drop=["rollout.dynamic_sampling"],
)  # fmt: skip


def _train(tmp_path, *extra: str):
    """A tiny two-step run with a checkpoint after each step; its directory."""
    sets = [*TINY_RUN, f"run.output_dir={tmp_path}", "run.name=run", *extra]
    result = runner.invoke(app, ["train", *(x for s in sets for x in ("--set", s))])
    assert result.exit_code == 0, result.output
    return tmp_path / "run"


HALF_MARKS = (
    'grader.spec={type="multi", name="half", calculate_output="0.5 * a", graders={a={'
    'type="string_check", name="a", operation="ne", input="{{sample.output_text}}", '
    'reference="~"}}}'
)
"""A grader spec giving every completion 0.5: it passes at the run's threshold of 0.5 only."""


def test_eval_of_a_run_directory_takes_its_newest_checkpoint_env_and_limits(tmp_path):
    run = _train(tmp_path, "eval.tasks=3", HALF_MARKS, "grader.pass_threshold=0.5")
    out = tmp_path / "e.json"
    result = runner.invoke(app, ["eval", "--model", str(run), "--tasks", "2", "--out", str(out),
                                 "--compare", str(run)])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    newest = str(run / "checkpoints" / "step_000002")
    assert (data["model"], data["compare_model"]) == (newest, newest)
    assert (data["env"], data["env_kwargs"]) == ("arith-v1", {"levels": [2]})
    assert f"{run}: step_000002 on arith-v1" in result.stdout
    assert "max_new_tokens 3, max_turns 2" in result.stdout  # eval.max_new_tokens wins
    # what the command line gives wins over the run's config
    given = ["--env-kwargs", '{"levels": [1]}', "--max-new-tokens", "2"]
    result = runner.invoke(
        app, ["eval", "--model", str(run), "--tasks", "2", "--out", str(out), *given]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["env_kwargs"] == {"levels": [1]}
    assert "max_new_tokens 2, max_turns 2" in result.stdout
    # without flags, the CLI and the API both repeat the run's "after" evaluation: its
    # eval.tasks, seed, grader spec and pass threshold
    result = runner.invoke(app, ["eval", "--model", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    cli, api = json.loads(out.read_text()), rldojo.evaluate(run)
    after = json.loads((run / "summary.json").read_text())["evals"]["after"]
    assert (len(cli["rows"]), cli["accuracy"]) == (api.n, api.accuracy) == (3, 1.0)
    assert (after["n"], after["accuracy"]) == (3, 1.0)
    assert [r["task_id"] for r in cli["rows"]] == [r["task_id"] for r in api.rows]
    given = ["--tasks", "2", "--pass-threshold", "0.6"]  # a flag wins, as an argument does
    result = runner.invoke(app, ["eval", "--model", str(run), "--out", str(out), *given])
    assert result.exit_code == 0, result.output
    cli, api = json.loads(out.read_text()), rldojo.evaluate(run, n=2, pass_threshold=0.6)
    assert (len(cli["rows"]), cli["accuracy"]) == (api.n, api.accuracy) == (2, 0.0)


def test_eval_of_a_lora_run_merges_its_adapter(tmp_path):
    pytest.importorskip("peft")
    run = _train(tmp_path, "model.lora={r=4, alpha=8}", "run.steps=1")
    out = tmp_path / "e.json"
    checkpoint = run / "checkpoints" / "step_000001"
    assert (checkpoint / "adapter_config.json").exists()  # an adapter, not a whole model
    result = runner.invoke(app, ["eval", "--model", str(run), "--tasks", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["model"] == str(checkpoint)


def test_eval_of_a_run_without_a_checkpoint_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[env]\nid = "arith-v1"\n')
    result = runner.invoke(app, ["eval", "--model", str(run)])
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.strip() == (f"error: model {str(run)!r}: a run directory without a "
                                     "checkpoint yet (RUN/checkpoints/step_NNNNNN)")  # fmt: skip


def reversed_ok(prompt, completion, answer):
    """A reward function: a run trained on it records an env only its process knows."""
    return float(completion.strip() == answer[::-1])


def test_eval_of_a_run_on_a_reward_function_says_to_evaluate_it_from_python(tmp_path):
    rows = [{"prompt": "abc", "answer": "cba"}, {"prompt": "xy", "answer": "yx"}]
    config = with_reward(as_config({"model": {"name": "tiny-random"}}), reversed_ok, rows, rows)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_config(config))  # what `rldojo.train` records
    result = runner.invoke(app, ["eval", "--model", str(run)])
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.strip() == (
        f"error: {run}: the run trained on a reward function ({config.env.id}), which only the "
        "Python process that trained it knows; evaluate it from Python: "
        f"rldojo.evaluate({str(run)!r}, tasks=ROWS, reward=FUNCTION)"
    )
    # from Python, in a process that never registered the run's environment
    (run / "config.toml").write_text('[env]\nid = "reward.gone-v1"\n')
    with pytest.raises(ValueError) as refused:
        rldojo.evaluate(run)
    assert str(refused.value) == (
        f"{run}: the run trained on a reward function (reward.gone-v1), which only the Python "
        f"process that trained it knows; evaluate it from Python: rldojo.evaluate({str(run)!r}, "
        "tasks=ROWS, reward=FUNCTION)"
    )
