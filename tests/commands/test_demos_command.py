"""`rldojo demos`: expert demos to JSONL, a teacher endpoint, and one-line input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.commands.demos import _rows
from rldojo.envs.experts import expert_for
from rldojo.envs.registry import make_env
from rldojo.inference.engine import ScriptedEngine
from rldojo.inference.server import start_server

runner = CliRunner()


def _one_line_error(result, *needles: str) -> None:
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, result.output
    assert all(needle in lines[0] for needle in needles), lines[0]


@pytest.mark.slow  # the sandbox
def test_expert_demos_of_arith_tools_are_five_passing_lines(tmp_path):
    out = tmp_path / "demos.jsonl"
    result = runner.invoke(app, ["demos", "arith-tools-v1", "--n", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all(r["passed"] and r["status"] == "ok" for r in rows)
    assert {r["source"] for r in rows} == {"expert"} and [r["turns"] for r in rows] == [2] * 5
    assert [r["seed"] for r in rows] == list(range(5))
    assert rows[0]["tools"][0]["function"]["name"] == "calculator"
    assert "passed" in result.output and "mean tool calls" in result.output
    assert not list(tmp_path.glob(".demos.jsonl*"))  # the temp file was renamed away


def test_keep_all_writes_the_lost_games_too(tmp_path):
    out = tmp_path / "games.jsonl"
    args = ["demos", "tictactoe-v1", "--n", "20", "--out", str(out), "--keep", "all",
            "--env-kwargs", '{"opponent_depth": 0}']  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20 and sum(r["passed"] for r in rows) == 19  # measured


@pytest.mark.slow  # an HTTP server
def test_teacher_demos_through_an_endpoint(tmp_path):
    kwargs = {"levels": [1], "python": "off"}
    tasks = make_env("arith-tools-v1", **kwargs).tasks("train", n=3)
    by_prompt, expert = {t.prompt: t for t in tasks}, expert_for("arith-tools-v1")

    def reply(request):
        task = by_prompt[request.messages[1]["content"]]
        return expert.act(request.messages, task) if task is not tasks[1] else "<answer>7</answer>"

    out = tmp_path / "t.jsonl"
    with start_server(ScriptedEngine(reply, model="big")) as server:
        result = runner.invoke(app, [
            "demos", "arith-tools-v1", "--n", "3", "--out", str(out), "--teacher",
            f"{server.url}#big", "--samples", "2", "--env-kwargs", json.dumps(kwargs),
            "--api-key", "local",
        ])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [tasks[0].id, tasks[2].id]
    assert {r["source"] for r in rows} == {"teacher:big"}


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["nope-v1"], ["unknown environment 'nope-v1'"]),
        (["arith-v1"], ["arith-v1 has no expert", "crm-v1"]),
        (["crm-v1", "--env-kwargs", "{levels: [1]}"], ["--env-kwargs is not valid JSON"]),
        (["crm-v1", "--env-kwargs", "[1]"], ["--env-kwargs must be a JSON object"]),
        (["crm-v1", "--env-kwargs", '{"levels": [9]}'], ["levels"]),
        (["crm-v1", "--keep", "some"], ["--keep must be 'passed' or 'all'"]),
        (["crm-v1", "--teacher", "http://127.0.0.1:1/v1"], ["#model-name"]),
        (["crm-v1", "--format", "chatml"], ["--format must be 'text' or 'openai'"]),
        (
            ["crm-v1", "--format", "openai", "--keep", "all"],
            ["cannot keep failed", "--keep passed"],
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needles):
    out = tmp_path / "demos.jsonl"
    result = runner.invoke(app, ["demos", *args, "--n", "2", "--out", str(out)])
    _one_line_error(result, *needles)
    assert not out.exists()


def test_an_out_that_cannot_be_written_fails_before_any_episode(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(app, ["demos", "crm-v1", "--out", str(blocker / "d.jsonl")])
    _one_line_error(result, "--out", "is not a directory")
    result = runner.invoke(app, ["demos", "crm-v1", "--out", str(tmp_path)])
    _one_line_error(result, "is a directory")


REPO = Path(__file__).resolve().parents[2]


def _prompts(out: Path) -> list[str]:
    return [json.loads(line)["messages"][1]["content"] for line in out.read_text().splitlines()]


@pytest.mark.slow  # the sandbox
def test_the_readme_command_line_plays_the_configs_env(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "demos.jsonl"
    result = runner.invoke(app, ["demos", "examples/agentic_arith_tools.toml", "--n", "2",
                                 "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    kwargs = {
        "levels": [1, 2],
        "python": "auto",
        "schema_style": "json",
        "reward": {"tag_reward": 0.1, "tool_cost": 0.02},
    }  # the config's [env] kwargs
    tasks = make_env("arith-tools-v1", **kwargs).tasks("train", n=2)
    assert _prompts(out) == [t.prompt for t in tasks]


def test_the_env_and_its_kwargs_come_from_the_config_set_and_env_kwargs(tmp_path):
    config = _config(tmp_path, '[env]\nid = "arith-tools-v1"\nkwargs = { levels = [3] }\n')
    out = tmp_path / "demos.jsonl"
    args = ["demos", config, "--n", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _prompts(out) == [t.prompt for t in make_env("arith-tools-v1", levels=[3]).tasks(n=2)]
    # --set overrides the config; --env-kwargs is merged over its kwargs
    result = runner.invoke(app, [*args, "--set", "env.kwargs.levels=[1]",
                                 "--env-kwargs", '{"python": "off"}'])  # fmt: skip
    assert result.exit_code == 0, result.output
    expected = make_env("arith-tools-v1", levels=[1], python="off").tasks(n=2)
    assert _prompts(out) == [t.prompt for t in expected]
    assert _prompts(out) != [t.prompt for t in make_env("arith-tools-v1", levels=[3]).tasks(n=2)]


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "extra", "needles"),
    [
        ('[env]\nid = "crm-v1"\nkwargs = { levels = [9] }\n', [],
         ["c.toml: env.kwargs.levels: crm-v1: levels must be"]),
        ('[env]\nid = "crm-v9"\n', [], ["c.toml: unknown environment 'crm-v9'"]),
        ('[env]\nid = "crm-v1"\n', ["--set", "env.kwags={}"],
         ["--set env.kwags: unknown key (did you mean kwargs?)"]),
        ('[env]\nmix = [{ id = "crm-v1" }, { id = "arith-tools-v1" }]\n', [],
         ["c.toml: env.mix: rldojo demos plays one environment"]),
    ],
)  # fmt: skip
def test_a_config_error_is_one_line_naming_the_config(tmp_path, text, extra, needles):
    out = tmp_path / "demos.jsonl"
    result = runner.invoke(
        app, ["demos", _config(tmp_path, text), "--n", "2", "--out", str(out), *extra]
    )
    _one_line_error(result, *needles)
    assert not out.exists()


def test_set_needs_a_config(tmp_path):
    result = runner.invoke(app, ["demos", "crm-v1", "--set", "env.kwargs.levels=[1]"])
    _one_line_error(result, "--set needs a CONFIG.toml")


@pytest.mark.slow  # tiny-random
def test_openai_demos_train_on_the_same_tokens_as_text_demos(tmp_path, tiny):
    from rldojo.training.batch import build_token_batch
    from rldojo.training.demo_data import read_demos, tokenize_demos

    files = {form: tmp_path / f"{form}.jsonl" for form in ("text", "openai")}
    for form, out in files.items():
        kwargs = '{"levels": [3, 4]}'
        args = ["demos", "crm-v1", "--n", "2", "--env-kwargs", kwargs, "--format", form]
        result = runner.invoke(app, [*args, "--out", str(out)])
        assert result.exit_code == 0, result.output
    assert "as text" not in result.output  # every expert turn became tool_calls
    rows = [json.loads(line) for line in files["openai"].read_text().splitlines()]
    assert len(rows) == 2 and all(set(r) == {"messages", "tools"} for r in rows)
    calls = [m["tool_calls"] for r in rows for m in r["messages"] if "tool_calls" in m]
    assert max(map(len, calls)) == 2  # turns with two calls (levels 3 and 4)
    answered = [m["tool_call_id"] for r in rows for m in r["messages"] if m["role"] == "tool"]
    assert answered == [c["id"] for turn in calls for c in turn]  # each call, once, in order
    tokenizer = tiny[1]
    text, openai = (
        build_token_batch(tokenize_demos(read_demos(f)[0], tokenizer, max_seq_len=8192).rollouts, 0)
        for f in files.values()
    )
    assert text.input_ids.shape[1] > 1000  # whole episodes, system prompt included
    assert text.prompt_len == openai.prompt_len
    for name in ("input_ids", "attention_mask", "completion_ids", "policy_mask"):
        assert getattr(text, name).equal(getattr(openai, name)), name


def test_openai_rows_count_the_turns_that_keep_their_calls_as_text():
    call = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    turns = [("user", "go"), ("assistant", call), ("tool", "1"),
             ("assistant", f"So {call} ok"), ("tool", "1"), ("assistant", "done")]  # fmt: skip
    messages = [{"role": role, "content": content} for role, content in turns]
    record = {"messages": messages, "tools": None, "passed": True}
    assert _rows([record], "text") == ([record], 0)
    (row,), as_text = _rows([record], "openai")
    assert as_text == 1 and row["messages"][3]["content"] == f"So {call} ok"
    assert row["messages"][1]["tool_calls"][0]["id"] == "call_0_0"
