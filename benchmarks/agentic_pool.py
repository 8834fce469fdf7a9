"""Pool replications of one agentic pipeline: SFT -> SFT+RL over every seed's test games.

Each `benchmarks/agentic_pipeline.py` results file holds its SFT and SFT+RL pass counts
and the paired McNemar cells (SFT-only, RL-only passes), which fix its whole 2x2 table of
per-game outcomes; the pooled comparison is the same paired statistics
(`agentic_pipeline._rate`, `_paired`: Wilson intervals, exact McNemar, paired bootstrap)
over all the tables' games together. The seeds' runs have their own test games, so the
pooled games are independent.

Usage: python benchmarks/agentic_pool.py RESULTS.json [RESULTS.json ...] --out POOLED.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import agentic_pipeline as ap  # benchmarks/ is on sys.path


def table(result: dict[str, Any]) -> list[tuple[bool, bool]]:
    """The (SFT passed, SFT+RL passed) pair of every test game of one run, in cell order."""
    s, m = result["success"], result["paired"]["sft_to_sft_rl"]["mcnemar"]
    n, sft, rl = s["sft"]["n"], s["sft"]["passed"], s["sft_rl"]["passed"]
    both = sft - m["a_only"]
    if both < 0 or both + m["b_only"] != rl or both + m["a_only"] + m["b_only"] > n:
        raise ValueError("pass counts and McNemar cells disagree")
    cells = [(True, True)] * both + [(True, False)] * m["a_only"] + [(False, True)] * m["b_only"]
    return cells + [(False, False)] * (n - len(cells))


def pool(paths: list[Path]) -> dict[str, Any]:
    sft: dict[str, bool] = {}
    rl: dict[str, bool] = {}
    runs = []
    for path in paths:
        result = json.loads(path.read_text())
        for i, (a, b) in enumerate(table(result)):
            sft[f"{path.name}:{i}"], rl[f"{path.name}:{i}"] = a, b
        runs.append({"file": path.name, "overrides": result["overrides"],
                     "cpu_flags": result["machine"]["cpu_flags"]})  # fmt: skip
    return {"runs": runs, "sft": ap._rate(sft), "sft_rl": ap._rate(rl),
            "sft_to_sft_rl": ap._paired(sft, rl)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    pooled = pool(args.results)
    args.out.write_text(json.dumps(pooled, indent=2))
    s, p = pooled, pooled["sft_to_sft_rl"]
    print(
        f"{len(args.results)} runs: SFT {s['sft']['passed']}/{s['sft']['n']} -> SFT+RL "
        f"{s['sft_rl']['passed']}/{s['sft_rl']['n']}, {p['diff']:+.1%} "
        f"({p['diff_ci95'][0]:+.1%} to {p['diff_ci95'][1]:+.1%}), McNemar "
        f"{p['mcnemar']['a_only']}/{p['mcnemar']['b_only']}, p={p['mcnemar']['p_value']:.3g}"
        f" -> {args.out}"
    )


if __name__ == "__main__":
    main()
