"""benchmarks/agentic_gpu.sh --dry: the GPU check's three pipelines (the committed
agentic recipes, LoRA included) run end to end on tiny-random on the CPU, and the smoke
run leaves the committed GPU results untouched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import warm

pytestmark = pytest.mark.slow  # the GPU check's dry mode, training tiny-random

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = {"crm_scaled": "crm", "crm_success_kl": "crm", "ttt_scaled": "tictactoe"}
# Both layouts: the legacy flat files and benchmarks/results/agentic_pipeline/.
GPU_RESULTS = ("agentic_*_gpu_*.json", "agentic_pipeline/*_gpu_*.json")


def _digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for pattern in GPU_RESULTS for p in RESULTS.glob(pattern)}  # fmt: skip


def test_dry_run_trains_every_variant_and_keeps_the_committed_results(tmp_path):
    before = _digests()
    env = {**os.environ, "OUT_DIR": str(tmp_path), "LIMIT_S": "300",
           "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
    # the pipelines fork from a warm interpreter (tests/warm.py) that agrees with the
    # variables the script exports
    env["PYTHON"] = warm.python({**env, **warm.BENCHMARK_EXPORTS})
    done = subprocess.run(["bash", "benchmarks/agentic_gpu.sh", "--dry"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for variant, env_name in VARIANTS.items():
        path = tmp_path / "agentic_pipeline" / f"{env_name}_dry_{variant}.json"
        result = json.loads(path.read_text())
        assert result["manifest"]["dry"] is True
        assert result["rl"]["steps"] == 2 and result["rl"]["stopped"] == "steps"
        assert all(s.startswith("ok/") for s in result["rl"]["statuses"])
        assert (tmp_path / f"{variant}.tgz").stat().st_size > 0
    assert _digests() == before
    assert not list(RESULTS.glob("agentic_*_dry_*.json"))
    assert not list(RESULTS.glob("agentic_pipeline/*_dry_*.json"))


def test_a_failed_pipeline_fails_the_script(tmp_path):
    # An interpreter that exits 1 at once: every pipeline fails, with no timing involved.
    env = {**os.environ, "PYTHON": "false", "OUT_DIR": str(tmp_path)}
    done = subprocess.run(["bash", "benchmarks/agentic_gpu.sh", "--dry"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    failed = done.stdout.strip().splitlines()[-1]
    assert failed.startswith("agentic_gpu: failed:")
    assert set(failed.split(":")[2].split("(")[0].split()) == set(VARIANTS)
    assert not list(tmp_path.glob("**/*.json"))
