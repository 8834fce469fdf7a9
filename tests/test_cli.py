"""The command line: one-line errors with exit code 2, listing, doctor, a tiny train and eval."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rldojo.cli import app

runner = CliRunner()


def test_bad_config_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[loss]\nrho = 2.0\n")
    result = runner.invoke(app, ["train", str(path)])
    assert result.exit_code == 2
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1
    assert "bad.toml" in lines[0] and "loss.rho" in lines[0]


def test_unknown_env_and_bad_data_are_one_line(tmp_path):
    result = runner.invoke(app, ["train", "--set", "env.id=nope-v1"])
    assert result.exit_code == 2
    assert "unknown environment 'nope-v1'" in result.output
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"}\n')
    result = runner.invoke(
        app, ["train", "--set", "env.id=math-v1", "--set", f'env.kwargs={{path="{data}"}}']
    )
    assert result.exit_code == 2
    assert "d.jsonl:2" in result.output and "answer" in result.output


@pytest.mark.slow  # probes the sandbox: processes
def test_envs_and_doctor():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0
    assert "arith-v1" in result.output and "math-v1" in result.output
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0
    assert "torch" in result.output and "sandbox" in result.output
    assert "rollout engine" not in result.output
    result = runner.invoke(app, ["doctor", "--config", "examples/agentic_web_crm.toml"])
    assert result.exit_code == 0
    words = result.output.split()  # the table wraps its cells
    assert "engine" in words and "lockstep:" in words and "generate" in words
    assert "inference" in words and "trainer's" in words


@pytest.mark.slow  # trains tiny-random
def test_train_and_eval_tiny(tmp_path):
    args = [
        "train", "--set", "model.name=tiny-random", "--set", "run.steps=1",
        "--set", f"run.output_dir={tmp_path}", "--set", "run.name=cli",
        "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2",
        "--set", "sampling.max_new_tokens=4", "--set", "eval.tasks=2",
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["steps"] == 1
    ckpt = tmp_path / "cli" / "checkpoints" / "step_000001"
    out = tmp_path / "eval.json"
    result = runner.invoke(
        app,
        ["eval", "--model", str(ckpt), "--tasks", "3", "--max-new-tokens", "4", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_text())["rows"]) == 3


@pytest.mark.slow  # trains tiny-random
def test_a_run_with_multiline_strings_reruns_and_resumes_from_its_config(tmp_path):
    config = tmp_path / "multi.toml"
    config.write_text(
        '[model]\nname = "tiny-random"\n'
        '[env]\nid = "arith-v1"\n'
        'kwargs = { system_prompt = """You add numbers.\nSay "Answer: N" at the end ✓.\n""" }\n'
        '[sampling]\nmax_new_tokens = 4\nstop = ["\\n\\n", "\\\\end"]\n'
        "[rollout]\nprompts_per_step = 2\ngroup_size = 2\n"
        f'[run]\nsteps = 1\noutput_dir = "{tmp_path}"\nname = "multi"\n'
        "[eval]\ntasks = 0\n"
    )
    assert runner.invoke(app, ["train", str(config)]).exit_code == 0
    run = tmp_path / "multi"
    written = run / "config.toml"
    from rldojo.config import load_config

    assert load_config(written).env.kwargs == load_config(config).env.kwargs
    # Resume (nothing left to do) and more steps from the run's own config.
    result = runner.invoke(app, ["train", "--resume", str(run), "--set", "run.steps=2"])
    assert result.exit_code == 0, result.output
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    # The resume rewrote config.toml with steps = 2; a fresh run from it trains 2 steps.
    rerun = ["train", str(written), "--set", "run.name=again"]
    assert runner.invoke(app, rerun).exit_code == 0
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["steps"] == 2
