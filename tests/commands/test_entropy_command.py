"""`rldojo entropy` on the tiny model: generated sequences, a ledger, two checkpoints, plots."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.registry import make_env
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts
from rldojo.store.ledger import Ledger
from rldojo.types import SamplingParams, Score

pytestmark = pytest.mark.slow  # samples from tiny-random

runner = CliRunner()
PNG = b"\x89PNG"


def test_entropy_report_compare_and_plots(tmp_path):
    out = tmp_path / "ent"
    args = ["entropy", "--model", "tiny-random", "--compare", "tiny-random", "--prompts", "3",
            "--max-new-tokens", "8", "--temperature", "0.7", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["source"] == "generated" and report["temperature"] == 0.7
    assert report["stats"]["count"] > 0 and 0 <= report["stats"]["frac_below_0.01"] <= 1
    assert report["forking_tokens"] and report["low_entropy_tokens"]
    assert report["compare"]["overlap"]["overlap"] == 1.0  # the same weights: same positions
    for name in ("entropy_hist.png", "entropy_sequence.png", "entropy_change.png"):
        assert (out / name).read_bytes()[:4] == PNG
    assert "| p80 | 0.672 |" in (out / "report.md").read_text()


def test_entropy_from_a_run_ledger(tmp_path, tiny):
    model, tokenizer = tiny
    tasks = make_env("arith-v1").tasks("train", n=2)
    rollouts = asyncio.run(
        collect_rollouts(
            lambda: make_env("arith-v1"),
            TransformersPolicy(model, tokenizer),
            [(t, 0, i) for i, t in enumerate(tasks)],
            SamplingParams(max_new_tokens=5, seed=0),
        )
    )
    (tmp_path / "run").mkdir()
    ledger = Ledger(tmp_path / "run" / "ledger.sqlite")
    ledger.add(0, rollouts, [Score(0.0)] * 2)
    ledger.close()
    out = tmp_path / "ent"
    result = runner.invoke(
        app,
        ["entropy", "--model", "tiny-random", "--ledger", str(tmp_path / "run"), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["sequences"] == 2 and report["stats"]["count"] == 10
    result = runner.invoke(
        app, ["entropy", "--ledger", str(tmp_path / "none"), "--model", "tiny-random"]
    )
    assert result.exit_code == 2 and "no ledger" in result.output
