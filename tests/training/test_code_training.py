"""A tiny `rldojo train` run on code-v1 (the done-when of the code environments issue).

The tiny random model writes 8 tokens of noise: every completion fails its tests, which is
a real reward of 0 (status ok), never a sandbox error. The run shows the plumbing: tasks
from the procedural generator, grading in the sandbox, a full ledger, metrics.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import tomllib
from pathlib import Path

import pytest
from tiny_config import tiny_overrides

from rldojo.config import load_config
from rldojo.envs.registry import make_env
from rldojo.sandbox import probe
from rldojo.training.loop import run_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # trains tiny-random; the sandbox

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code_quickstart.toml"

TINY = tiny_overrides(
    "env.id=code-v1",
    "env.train_tasks=8",
    "sampling.max_new_tokens=8",
    "optim.micro_batch_size=4",
    "eval.tasks=2",
    "eval.max_new_tokens=8",
    "run.steps=2",
)


@pytest.fixture
def fast_tiny_model(tiny, monkeypatch):
    """Reuse the session's tiny model and tokenizer instead of rebuilding them per run."""
    model, tokenizer = tiny
    monkeypatch.setattr(
        "rldojo.training.run.load_model", lambda name, **kw: (copy.deepcopy(model), tokenizer)
    )


def test_tiny_training_run_on_code_v1(tmp_path, fast_tiny_model):
    if not probe().strict and os.environ.get("CI") != "true":
        pytest.skip("strict sandbox unavailable:\n" + probe().summary)
    cfg = load_config(None, [*TINY, f"run.output_dir={tmp_path}", "run.name=code"])
    summary = run_training(cfg)
    assert summary["steps"] == 2 and summary["rollouts"] == 8
    assert summary["accuracy_before"] is not None and summary["accuracy_after"] is not None
    run = tmp_path / "code"
    db = sqlite3.connect(run / "ledger.sqlite")
    rows = db.execute("SELECT env, status, score_status, score_value, components FROM rollouts")
    rows = rows.fetchall()
    assert len(rows) == 8
    for env, status, score_status, value, components in rows:
        assert env == "code-v1" and status in ("ok", "truncated")
        assert score_status == "ok" and value is not None  # a failed test is 0, not an error
        assert json.loads(components)["tests/total"] == 8.0  # 3 visible + 5 held out
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "time/step" in m] == [1, 2]


def test_example_config_loads_and_builds_its_env():
    cfg = load_config(EXAMPLE)
    assert cfg.model.name == "smollm2-135m-instruct"
    assert tomllib.loads(EXAMPLE.read_text())["env"]["id"] == cfg.env.id == "code-v1"
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    assert len(env.tasks("train", seed=cfg.run.seed, n=2)) == 2
    assert env.default_grader().name == "code_tests"
