"""The rollout viewer on a large ledger: first page and filters over 100,000 rollouts.

    python benchmarks/dashboard_ledger.py [--rows 100000] [--repeats 5] [--no-browser]
        [--results DIR] [--dry]

Writes a synthetic ledger through the real `Ledger` (SQLite, the schema `rldojo train`
writes: ~90-token completions, per-token logprobs and entropies), serves it with the
real dashboard on loopback and measures, for the first page and each filter:
- the JSON answer (`/api/rollouts`, page + total count), median of `--repeats`;
- in headless chromium (Debian's, through Playwright), the rollouts page from navigation
  to its first rows drawn, and a filter from submit to the new rows drawn.
Baseline, in the same run: what the viewer replaces, reading the ledger's rows into
Python and filtering there (`SELECT *` + json decode; the Parquet export is the same
read). Writes benchmarks/results/dashboard_ledger/default.json (`results_io`; `--dry`:
200 rows, once, no browser, into a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from machine_load import cpu_flags, load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, write_result

from rldojo.dashboard import start_dashboard
from rldojo.store.ledger import Ledger
from rldojo.types import Rollout, Score

WORDS = [
    "the",
    "answer",
    "is",
    "so",
    "we",
    "add",
    "carry",
    "one",
    "then",
    "total",
    "sum",
    "check",
    "final",
    "result",
]
FILTERS: dict[str, dict[str, Any]] = {
    "first_page": {},
    "status=timeout": {"status": "timeout"},
    "step=250": {"step": 250},
    "score>=0.5": {"score_min": 0.5},
    "text='carry seven'": {"text": "carry seven"},
    "env+score+text": {"env": "arith-v1", "score_max": 0.0, "text": "total"},
}


def build(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    ledger = Ledger(path)
    per_step = 64
    for start in range(0, rows, per_step):
        step = start // per_step
        batch, scores = [], []
        for i in range(min(per_step, rows - start)):
            n = rng.randint(40, 140)
            text = " ".join(rng.choice(WORDS) for _ in range(n // 2))
            if rng.random() < 0.01:
                text += " carry seven"
            status = "timeout" if rng.random() < 0.002 else "ok"
            batch.append(Rollout(
                task_id=f"arith-v1/train/0/{rng.randint(0, 5000)}", env="arith-v1",
                messages=[{"role": "user", "content": "What is 12 + 30?"},
                          {"role": "assistant", "content": text}],
                completion=text, prompt_ids=tuple(range(60)),
                completion_ids=tuple(rng.randint(0, 49151) for _ in range(n)),
                policy_mask=(True,) * n, logprobs=tuple(-rng.random() for _ in range(n)),
                entropies=tuple(rng.random() * 3 for _ in range(n)), sample_index=i % 8,
                status=status,
            ))  # fmt: skip
            scores.append(Score.failed("timeout", "slow") if status != "ok"
                          else Score(value=rng.choice([1.0, -0.5])))  # fmt: skip
        ledger.add(step, batch, scores)
    ledger.close()


def baseline(path: Path, flt: dict[str, Any]) -> float:
    """Read every row into Python and filter there; seconds."""
    t0 = time.perf_counter()
    db = sqlite3.connect(path)
    cur = db.execute("SELECT * FROM rollouts")
    names = [d[0] for d in cur.description]
    kept = []
    for row in cur:
        r = dict(zip(names, row, strict=True))
        r["messages"] = json.loads(r["messages"])
        r["logprobs"] = json.loads(r["logprobs"])
        if flt.get("status") and flt["status"] not in (r["status"], r["score_status"]):
            continue
        if "step" in flt and r["step"] != flt["step"]:
            continue
        if "score_min" in flt and (r["score_value"] is None or r["score_value"] < flt["score_min"]):
            continue
        if "score_max" in flt and (r["score_value"] is None or r["score_value"] > flt["score_max"]):
            continue
        if flt.get("text") and flt["text"] not in json.dumps(r["messages"]):
            continue
        kept.append(r)
    db.close()
    return time.perf_counter() - t0


def api_times(url: str, repeats: int) -> dict[str, Any]:
    out = {}
    with httpx.Client(base_url=url, timeout=60) as c:
        for name, flt in FILTERS.items():
            times, total = [], None
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = c.get("api/rollouts", params={"run": "big", **flt})
                times.append(time.perf_counter() - t0)
                r.raise_for_status()
                total = r.json()["total"]
            out[name] = {"median_s": statistics.median(times), "first_s": times[0],
                         "max_s": max(times), "matches": total}  # fmt: skip
    return out


def browser_times(url: str, repeats: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = b.new_page()
        loads, filters = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            page.goto(f"{url}rollouts?run=big")
            page.wait_for_selector("#rollouts tr.row")
            loads.append(time.perf_counter() - t0)
            page.select_option("select[name=status]", "timeout")
            t0 = time.perf_counter()
            page.click("#filters button[type=submit]")
            page.wait_for_function(
                "[...document.querySelectorAll('#rollouts tr.row')].every("
                "r => r.innerText.includes('timeout'))"
            )
            filters.append(time.perf_counter() - t0)
        b.close()
    out["rollouts_page_to_first_rows"] = {"median_s": statistics.median(loads), "max_s": max(loads)}
    out["filter_status_to_rows"] = {"median_s": statistics.median(filters), "max_s": max(filters)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    add_result_args(ap, "200 rows, once, no browser, into a temporary folder")
    args = ap.parse_args()
    if args.dry:
        args.rows, args.repeats, args.no_browser = 200, 1, True
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "big"
        run.mkdir()
        (run / "config.toml").write_text('[model]\nname = "tiny-random"\n')
        t0 = time.perf_counter()
        build(run / "ledger.sqlite", args.rows)
        build_s = time.perf_counter() - t0
        size = (run / "ledger.sqlite").stat().st_size
        base = {name: baseline(run / "ledger.sqlite", f) for name, f in
                (("first_page", {}), ("status=timeout", {"status": "timeout"}))}  # fmt: skip
        with start_dashboard([tmp]) as handle:
            api = api_times(handle.url, args.repeats)
            browser = {} if args.no_browser else browser_times(handle.url, args.repeats)
    result = {
        "rows": args.rows, "ledger_mb": round(size / 1e6, 1), "build_s": round(build_s, 1),
        "api": api, "browser": browser, "baseline_read_all_s": base,
        "speedup_first_page": base["first_page"] / api["first_page"]["median_s"],
        "machine": {"platform": platform.platform(), "cpu_flags": cpu_flags(),
                    "cores": os.cpu_count(), "load_average": load_average()},
    }  # fmt: skip
    label = "dry" if args.dry else "default"
    path = write_result("dashboard_ledger", label, result, out_dir=args.results, seed=0,
                        dry=args.dry)  # fmt: skip
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
