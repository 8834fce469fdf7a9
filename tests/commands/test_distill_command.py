"""`rldojo distill` on the tiny model: a perturbed student towards the tiny teacher."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from rldojo.cli import app

pytestmark = pytest.mark.slow  # loads tiny-random or starts the CLI

runner = CliRunner()


def test_distill_command_saves_a_loadable_student(tmp_path, tiny):
    model, tokenizer = tiny
    student = copy.deepcopy(model)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    student.save_pretrained(tmp_path / "student0")
    tokenizer.save_pretrained(tmp_path / "student0")
    out = tmp_path / "out"
    args = ["distill", "--teacher", "tiny-random", "--student", str(tmp_path / "student0"),
            "--divergence", "reverse", "--sequences", "student", "--steps", "2",
            "--batch-size", "2", "--max-new-tokens", "4", "--lr", "1e-3",
            "--out", str(out), "--set", "eval.tasks=0", "--set", "run.report_to=[]"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "KL/token" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["divergence"] == "reverse"
    from rldojo.policy.models import load_model

    load_model(summary["checkpoint"])  # every command can load the result
    bad = runner.invoke(app, ["distill", "--teacher", "a", "--student", "b", "--divergence", "x"])
    assert bad.exit_code == 2
