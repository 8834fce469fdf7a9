"""The command line: one-line errors with exit code 2, listing, doctor, a tiny train and eval."""

from __future__ import annotations

import json

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


def test_envs_and_doctor():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0
    assert "arith-v1" in result.output and "math-v1" in result.output
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0
    assert "torch" in result.output and "sandbox" in result.output


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
