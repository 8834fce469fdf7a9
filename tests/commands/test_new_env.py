"""`rldojo new-env`: the scaffold passes check-env, trains one step and passes its own tests.

Also `rldojo check-env --show`: the transcript of the scaffolded environments (reference
answer, scripted tool calls) and of a built-in without a reference answer (filler turns).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rldojo.cli import app

runner = CliRunner()

TINY = [
    "--set", "model.name=tiny-random", "--set", "run.steps=1", "--set", "eval.tasks=2",
    "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2",
    "--set", "sampling.max_new_tokens=8", "--set", "eval.max_new_tokens=8",
]  # fmt: skip

FILES = (
    "pyproject.toml",
    "{name}/__init__.py",
    "{name}/env.py",
    "{name}/grader.py",
    "tests/test_env.py",
    "train.toml",
)


@pytest.fixture
def isolated_imports(monkeypatch):
    """Undo what importing a scaffolded package (names starting ``ndojo_``) does to
    `sys.path` and `sys.modules`; other modules imported meanwhile (torch, transformers)
    stay loaded."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [m for m in sys.modules if m.startswith("ndojo_")]:
        del sys.modules[name]


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.slow  # trains tiny-random; runs pytest
@pytest.mark.parametrize(
    ("name", "tools", "factory"),
    [("ndojo_plain", False, "NdojoPlainEnv"), ("ndojo_tools", True, "NdojoToolsEnv")],
)
def test_scaffold_checks_trains_and_passes_its_tests(
    name, tools, factory, tmp_path, monkeypatch, isolated_imports
):
    result = runner.invoke(app, ["new-env", name, "--dir", str(tmp_path), *(["--tools"] * tools)])
    assert result.exit_code == 0, result.output
    project = tmp_path / name
    for rel in FILES:
        assert (project / rel.format(name=name)).is_file(), rel
    assert f"rldojo check-env {name}.env:{factory} --show" in result.output
    pyproject = (project / "pyproject.toml").read_text()
    assert f'"{name}-v1" = "{name}.env:{factory}"' in pyproject

    monkeypatch.chdir(project)  # module:factory paths resolve from the current directory
    check = runner.invoke(app, ["check-env", f"{name}.env:{factory}", "--show"])
    assert check.exit_code == 0, check.output
    assert lines(check.output)[-1] == f"check-env {name}.env:{factory}: PASS"
    assert "policy turns: the task's reference answer" in check.output
    assert "score: 1.0 (ok)" in check.output

    run = [
        "train", str(project / "train.toml"), *TINY,
        "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.name=r",
    ]  # fmt: skip
    trained = runner.invoke(app, run)
    assert trained.exit_code == 0, trained.output
    assert json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())["steps"] == 1

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]),
    }
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_show_prints_scripted_tool_calls_and_env_replies(tmp_path, monkeypatch, isolated_imports):
    assert (
        runner.invoke(app, ["new-env", "ndojo_show", "--dir", str(tmp_path), "--tools"]).exit_code
        == 0
    )
    monkeypatch.chdir(tmp_path / "ndojo_show")
    call = '<tool_call>{"name": "price", "arguments": {"item": "pencil"}}</tool_call>'
    result = runner.invoke(
        app,
        ["check-env", "ndojo_show.env:NdojoShowEnv", "--show", "--action", call,
         "--action", "<tool_call>{oops</tool_call>", "--action", "<answer>1</answer>"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "policy turns: your 3 --action turn(s)" in out
    assert "[system] (prompt)" in out and "[user] (prompt)" in out
    assert "[assistant] (policy turn 1)" in out and "[assistant] (policy turn 3)" in out
    assert '-> tool call: price {"item": "pencil"}' in out
    assert "-> bad tool call (malformed)" in out
    assert out.count("[tool] (env reply)") == 2
    assert "end: done after 3 turn(s) (answer)" in out
    assert "score: -0.05 (ok)" in out  # wrong answer, one protocol error


def test_show_without_a_reference_answer_uses_fixed_filler_turns():
    result = runner.invoke(app, ["check-env", "tictactoe-v1", "--show"])
    assert result.exit_code == 0, result.output
    assert "the checker's fixed filler turns (this task has no reference answer)" in result.output
    assert "[assistant] (policy turn 1)" in result.output
    assert "score: " in result.output


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("9lives", "not a valid Python identifier"),
        ("my-env", "not a valid Python identifier"),
        ("class", "not a valid Python identifier"),
        ("MyEnv", "must be lowercase"),
        ("json", "already an importable module"),
    ],
)
def test_bad_name_is_one_line_exit_2(name, message, tmp_path):
    result = runner.invoke(app, ["new-env", name, "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert len(lines(result.output)) == 1 and message in result.output
    assert list(tmp_path.iterdir()) == []


def test_existing_directory_is_refused(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["new-env", "taken", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert len(lines(result.output)) == 1 and "already exists" in result.output
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]
