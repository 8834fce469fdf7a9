"""benchmarks/gpu_check.sh --device cpu --dry, run the way a GPU session starts it: every
part finishes (or is skipped with its reason), the summary and each benchmark's file carry
a complete manifest, TRL's side runs in both vs_trl parts (full and LoRA), and nothing is
written into benchmarks/results/.

The first thing a session with a GPU runs, and no GPU runs it here: this test is what keeps
it working. About 70 s on a shared 2-core CPU (vs_trl's two parts are most of it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_io  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # a shell script that trains tiny-random in subprocesses
    pytest.mark.timeout(800),  # the parts' own limits add up to 720 s
    pytest.mark.skipif(
        importlib.util.find_spec("trl") is None,
        reason="trl is not installed (the `bench` extra: pip install -e '.[bench]'); "
        "without it gpu_check runs rldojo's side of vs_trl alone",
    ),
]

PARTS = {"doctor", "quickstart", "quickstart_vllm", "tokens", "async", "async_vllm", "vs_trl",
         "vs_trl_lora"}  # fmt: skip
WITH_RESULT = {"tokens", "async", "vs_trl", "vs_trl_lora"}
"""The parts that write a benchmark file through results_io (quickstart: a run summary)."""
FOLDERS = ("gpu_check", "vs_trl", "async_vs_sync")
"""benchmarks/results/ folders of these benchmarks, which a dry run must leave alone."""


def _listing() -> list[str]:
    return sorted(str(p.relative_to(RESULTS)) for f in FOLDERS for p in (RESULTS / f).rglob("*"))


def test_the_cpu_dry_run_passes_every_part_and_writes_outside_results(tmp_path: Path):
    before = _listing()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp_path)}
    for name in ("OUT_DIR", results_io.ENV_VAR):
        env.pop(name, None)
    # Its dozen Python processes fork from a warm interpreter (tests/warm.py), one that
    # agrees with the variables the script exports (the children of vs_trl start cold).
    env["PYTHON"] = warm.python({**env, **warm.BENCHMARK_EXPORTS})
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--device", "cpu", "--dry"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=780,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    [path] = tmp_path.glob("gpu_check_dry.*/gpu_check_cpu.json")  # the dry run's own folder
    summary = json.loads(path.read_text())
    assert results_io.is_complete(summary) == []
    assert summary["manifest"]["dry"] is True
    assert summary["manifest"]["script"] == "benchmarks/gpu_check.sh"
    parts = summary["parts"]
    assert set(parts) == PARTS
    for name, part in parts.items():
        assert part.get("ok") or part["skipped"], (name, part)
    for name in WITH_RESULT:
        result = parts[name]["result"]
        assert results_io.is_complete(result) == [], name
        assert result["manifest"]["dry"] is True, name
    for name, lora in (("vs_trl", False), ("vs_trl_lora", True)):
        result = parts[name]["result"]
        assert result["modes"]["lora"] is lora and result["prompts_identical"]
        assert len(result["rldojo"]["steps"]) == len(result["trl"]["steps"]) == 1
        assert result["comparison"]["peak_rss_ratio"] > 0
    assert _listing() == before
