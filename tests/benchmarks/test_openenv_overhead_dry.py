"""benchmarks/openenv_overhead.py --dry: both environments played both ways (in process
and through `rldojo env serve` + OpenEnv's client) with equal actions and rewards, the
JSON complete, and nothing written into benchmarks/results/."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import warm

pytest.importorskip("openenv", reason="the openenv extra: pip install 'rldojo[openenv]'")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_io  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a server subprocess per env


def test_the_dry_mode_plays_both_envs_both_ways_and_writes_outside_results(tmp_path):
    before = sorted(p.name for p in (RESULTS / "openenv_overhead").glob("*"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop(results_io.ENV_VAR, None)
    done = warm.run(  # forked from a warm interpreter (tests/warm.py)
        [sys.executable, "benchmarks/openenv_overhead.py", "--dry", "--results", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "openenv_overhead" / "dry.json").read_text())
    assert results_io.is_complete(result) == []
    assert result["manifest"]["dry"] is True and "--dry" in result["manifest"]["command"]
    assert set(result["envs"]) == {"crm-v1", "tictactoe-v1"} and result["server"] == "thread"
    for r in result["envs"].values():
        assert r["episodes"] == 2 and len(r["rewards"]) == 2
        assert set(r["median"]) == {"in_process", "served"}
        assert r["median"]["served"]["tool_turns"] == r["median"]["in_process"]["tool_turns"]
        ratio = r["median"]["served"]["turn_ms"] / r["median"]["in_process"]["turn_ms"]
        assert r["ratio_turn_served_over_in_process"] == pytest.approx(ratio)
    assert result["envs"]["crm-v1"]["rewards"] == [1.0, 1.0]  # the expert solves them
    assert sorted(p.name for p in (RESULTS / "openenv_overhead").glob("*")) == before
