"""benchmarks/estimate_accuracy.py --dry: every config's dry-run estimate and real steps
run end to end on tiny-random, the JSON records the machine and the comparison, and
nothing is written into benchmarks/results/."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import warm

from rldojo.training.estimate import PLAYED_EPISODES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # subprocesses training tiny-random


def test_the_dry_mode_compares_every_config_and_writes_outside_results():
    before = sorted(p.name for p in RESULTS.iterdir())
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = warm.run(
        [sys.executable, "benchmarks/estimate_accuracy.py", "--dry", "--steps", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = Path(done.stdout.strip().splitlines()[-1].removeprefix("wrote "))
    assert out.is_file() and RESULTS not in out.parents  # a temporary directory
    result = json.loads(out.read_text())
    shutil.rmtree(out.parent.parent)  # the temporary folder results_io made
    manifest = result["manifest"]
    assert manifest["dry"] is True and manifest["command"][-3:] == ["--dry", "--steps", "1"]
    assert {"cpu_model", "cpu_flags"} <= set(manifest["machine"])
    assert {"commit", "dirty"} <= set(manifest["git"])
    assert {"date", "wall_s"} <= set(manifest)
    assert set(result["runs"]) == {"quickstart", "code", "agentic"}
    for run in result["runs"].values():
        assert run["estimate"]["basis"].startswith("calibrated here")
        assert len(run["measured"]["steps"]) == 1
        assert run["ratio"] == run["estimate"]["step_s"] / run["measured"]["mean_step_s"]
    agentic = result["runs"]["agentic"]
    assert agentic["estimate"]["turns"] > 1  # priced at the played turns; the range's ends too
    assert agentic["estimate"]["played"] == PLAYED_EPISODES
    assert agentic["estimate"]["mean_turns"] == agentic["estimate"]["turns"]  # random: nudged
    assert {"ratio_one_turn", "ratio_all_turns"} <= set(agentic)
    assert all(run["estimate"]["load"] >= 0 for run in result["runs"].values())
    assert sorted(p.name for p in RESULTS.iterdir()) == before


def test_an_unknown_config_is_refused():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = warm.run(
        [sys.executable, "benchmarks/estimate_accuracy.py", "--dry", "--configs", "nope"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "unknown configs ['nope']" in done.stderr
