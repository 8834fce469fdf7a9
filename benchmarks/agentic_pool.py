"""Pool replications of one agentic pipeline: SFT -> SFT+RL over every seed's test games.

Each `benchmarks/agentic_pipeline.py` results file holds its SFT and SFT+RL pass counts
and the paired McNemar cells (SFT-only, RL-only passes), which fix its whole 2x2 table of
per-game outcomes; the pooled comparison is the same paired statistics
(`agentic_pipeline._rate`, `_paired`: Wilson intervals, exact McNemar, paired bootstrap)
over all the tables' games together. The seeds' runs have their own test games, so the
pooled games are independent.

Usage: python benchmarks/agentic_pool.py RESULTS.json [RESULTS.json ...]
           (--label NAME | --out POOLED.json) [--results DIR] [--dry]
Writes benchmarks/results/agentic_pool/<NAME>.json (`results_io`), or --out POOLED.json.
`--dry`: pools the three committed tic-tac-toe LoRA seeds (or the files given) into a
temporary folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import agentic_pipeline as ap  # benchmarks/ is on sys.path
from results_io import RESULTS, add_result_args, write_result

# Small committed inputs for the dry mode: reading them is all it does with them.
DRY_INPUTS = [RESULTS / f"agentic_tictactoe_lora_top10_seed{i}.json" for i in range(3)]


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
                     "cpu_flags": result["machine"]["cpu_flags"],
                     "git": result.get("manifest", {}).get("git")})  # fmt: skip
    return {"runs": runs, "sft": ap._rate(sft), "sft_rl": ap._rate(rl),
            "sft_to_sft_rl": ap._paired(sft, rl)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="*", type=Path, help="agentic_pipeline results")
    parser.add_argument("--label", help="the pooled file's name: agentic_pool/<label>.json")
    parser.add_argument("--out", type=Path, help="this file instead")
    add_result_args(parser, "pool the committed tic-tac-toe LoRA seeds into a temporary folder")
    args = parser.parse_args()
    if args.dry:
        args.inputs, args.label = args.inputs or DRY_INPUTS, args.label or "dry"
    if not args.inputs or not (args.label or args.out):
        parser.error("give the results to pool and --label (or --out)")
    pooled = pool(args.inputs)
    path = write_result("agentic_pool", args.label or args.out.stem, pooled,
                        out_dir=args.results, path=args.out, dry=args.dry)  # fmt: skip
    s, p = pooled, pooled["sft_to_sft_rl"]
    print(
        f"{len(args.inputs)} runs: SFT {s['sft']['passed']}/{s['sft']['n']} -> SFT+RL "
        f"{s['sft_rl']['passed']}/{s['sft_rl']['n']}, {p['diff']:+.1%} "
        f"({p['diff_ci95'][0]:+.1%} to {p['diff_ci95'][1]:+.1%}), McNemar "
        f"{p['mcnemar']['a_only']}/{p['mcnemar']['b_only']}, p={p['mcnemar']['p_value']:.3g}"
        f" -> {path}"
    )


if __name__ == "__main__":
    main()
