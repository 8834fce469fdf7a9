"""Every benchmark's `--dry` mode, run as a subprocess the way a user runs the script: it
finishes, writes its result through `results_io` into the temporary folder it was given
(never into benchmarks/results/), with a complete manifest and the values it promises.

Each runs forked from a warm interpreter (tests/warm.py: torch, transformers and rldojo
imported), with the command line, environment, working directory and `__main__` of
`python benchmarks/SCRIPT.py ...`: what a script spends is its own work, not ~5 s of
imports.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import warm

pytestmark = pytest.mark.slow  # each benchmark's --dry runs as a subprocess

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_io  # noqa: E402

Check = Callable[[dict[str, Any]], bool]


def _case(script: str, file: str, check: Check, *args: str) -> Any:
    return pytest.param(script, file, check, list(args), id=script)


CASES = [
    _case("env_throughput", "small.json",
          lambda r: r["sizes"]["small"]["snapshot_restore"]["mean_ms"] > 0),
    _case("env_workers", "dry.json",
          lambda r: set(r["results"]) == {"in_process", "1_worker", "2_workers"}
          and r["results"]["2_workers"]["statuses"] == {"ok": 4}),
    _case("sandbox_throughput", "dry.json",
          lambda r: r["runs_per_measurement"] == 8 and r["humaneval_grading"]["problems"] == 2
          and "ratio_median_latency" in r),
    _case("dashboard_ledger", "dry.json",
          lambda r: r["rows"] == 200 and r["api"]["first_page"]["median_s"] > 0
          and r["browser"] == {}),
    _case("agentic_pool", "dry.json",
          lambda r: len(r["runs"]) == 3 and "p_value" in r["sft_to_sft_rl"]["mcnemar"]),
    _case("partial_update_cost", "dry.json",
          lambda r: set(r["variants"]) == {"full", "lora_all", "lora_top1"}
          and r["variants"]["full"]["vs_full"] == 1.0),
    _case("precision", "*.json",
          lambda r: set(r["runs"]) == {"auto", "fp32", "bf16"}
          and r["ratio_auto_over_fastest"] > 0),
    _case("selected_logits", "dry.json",
          lambda r: set(r["median_train_s"]) == {"all_tokens", "selected_tokens"}
          and "max_abs_weight_difference" in r),
    _case("vllm_cpu", "dry.json",
          lambda r: r["sides"]["native"]["runs"][0]["batch"] == 8
          and ("vllm" in r["sides"]) != ("vllm" in r["skipped"])),
    _case("async_vs_sync", "native.json",
          lambda r: r["sync"]["max_policy_lag"] == 0 and r["async_lag1"]["max_policy_lag"] == 1
          and r["wall_ratio_async_over_sync"] > 0),
    _case("continuous_batching", "dry.json",
          lambda r: set(r["summary"]) == {"static", "continuous_refill_1", "batch_all"}),
    _case("game_policy_probe", "dry.json",
          lambda r: r["positions"] == 4 and 0 <= r["checkpoints"]["tiny"]["p_expert"] <= 1),
    _case("rollout_engine", "dry.json",
          lambda r: set(r["scenarios"]["latency"]["added_s"]) == {"lockstep", "episodes"}
          and all(run["statuses"] == {"ok": 4}
                  for side in ("wait", "no_wait")
                  for e in ("lockstep", "episodes")
                  for run in r["scenarios"]["latency"][side][e]["runs"])),
    _case("multiturn_generation", "dry.json",
          lambda r: {"before", "merged", "prefix_cache"} <= set(r["variants"]) and r["games"] == 2),
    _case("rho_ablation", "dry.json",
          lambda r: len(r["runs"]) == 2 and set(r["summary"]["arith"]) == {"top20", "full"}),
    _case("sdpa_padding_check", "cpu.json",
          lambda r: r["kernels"] and len(r["model"]) == 2 and r["cost"]["layers"] == 2,
          "--device", "cpu"),
    _case("memory_probe", "dry.json",
          lambda r: len(r["steps"]) == 1 and r["peak_rss_mib"] > 0),
    _case("vs_trl", "cpu_rldojo_only.json",
          lambda r: r["modes"]["dry"] and "summary" in r and r["rldojo"], "--sides", "rldojo"),
    _case("service_load", "dry.json",
          lambda r: r["jobs_created"] == 2 and r["jobs_lost"] == [] and r["read_failures"] == []),
    _case("quickstart", "dry.json",
          lambda r: r["steps"] == 2 and r["heldout_tasks"] == 8 and len(r["per_step"]) == 2
          and r["gain"] == r["accuracy_after"] - r["accuracy_before"], "--label", "dry"),
    _case("agentic_pipeline", "tictactoe.json",
          lambda r: r["rl"]["steps"] == 2 and "sft_to_sft_rl" in r["paired"],
          "--envs", "tictactoe-v1"),
    _case("capacity", "dry.json",
          lambda r: r["kind"] == "computed" and r["models"]["SmolLM2-135M"]["params"] == 134_515_008
          and len(r["per_rank_gib"]) == 4 and "measured_check" not in r
          and r["largest_fitting"]["full/checkpointing"]["1"] is not None),
    _case("sharded_memory", "dry.json",
          lambda r: [len(r["sides"][s]["ranks"]) for s in ("one", "before", "after")] == [1, 2, 2]
          and r["sides"]["after"]["ranks"][1]["param_bytes"]
          < r["sides"]["one"]["ranks"][0]["param_bytes"]
          and r["ratio_after"] > 0 and r["grpo"]["2"]["after"]["ranks"][0]["whole_copy"]
          and r["largest_fitting"]["after"] == r["params"]),
]  # fmt: skip


PRINTS = {
    "quickstart": [r"^held-out accuracy \(before\): 0\.0% \(8 tasks, greedy; 95% CI ",
                   r"^step +1 reward ", r"^step +2 reward ",
                   r"^held-out accuracy \(after\): .*95% CI ", r"^run directory: ",
                   r"^result: .*quickstart/dry\.json$"],
}  # fmt: skip
"""What a script prints on stdout (regular expressions, each matching a line): the
quickstart shows what README's "What the quickstart prints" describes."""


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("script", "file", "check", "args"), CASES)
def test_the_dry_mode_writes_a_complete_result_into_the_given_folder(
    script: str, file: str, check: Check, args: list[str], tmp_path: Path
):
    before = _listing(RESULTS / script)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    env.pop(results_io.ENV_VAR, None)
    command = [sys.executable, f"benchmarks/{script}.py", *args, "--dry", "--results",
               str(tmp_path)]  # fmt: skip
    done = warm.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                    timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [path] = (tmp_path / script).glob(file)
    result = json.loads(path.read_text())
    assert results_io.is_complete(result) == []
    manifest = result["manifest"]
    assert manifest["dry"] is True and manifest["script"] == f"benchmarks/{script}.py"
    assert (manifest["benchmark"], manifest["label"]) == (script, path.stem)
    assert manifest["command"][0] == sys.executable and "--dry" in manifest["command"]
    assert check(result)
    assert _listing(RESULTS / script) == before
    for pattern in PRINTS.get(script, []):
        assert re.search(pattern, done.stdout, re.MULTILINE), (pattern, done.stdout[-3000:])


def test_a_dry_run_refuses_benchmarks_results():
    with pytest.raises(SystemExit, match="a dry run writes outside"):
        results_io.results_dir(RESULTS / "env_workers", dry=True)
    fresh = results_io.results_dir(None, dry=True)
    assert fresh.is_dir() and RESULTS not in fresh.parents  # a new temporary folder
    fresh.rmdir()


def test_the_environment_variable_redirects_results(tmp_path, monkeypatch):
    monkeypatch.setenv(results_io.ENV_VAR, str(tmp_path))
    # the script a manifest names (under pytest-xdist a worker's __main__ has no __file__)
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(ROOT / "benchmarks/bench.py"),
                        raising=False)  # fmt: skip
    path = results_io.write_result("bench", "label", {"x": 1}, seed=3)
    assert path == tmp_path / "bench" / "label.json"
    doc = json.loads(path.read_text())
    assert doc["x"] == 1 and doc["manifest"]["seed"] == 3 and doc["manifest"]["dry"] is False
    assert results_io.is_complete(doc) == []
    with pytest.raises(ValueError, match="manifest"):
        results_io.write_result("bench", "label", {"manifest": 1})
