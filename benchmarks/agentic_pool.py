"""Pool replications of one agentic pipeline: SFT -> SFT+RL over every seed's test games.

Each `benchmarks/agentic_pipeline.py` results file holds its SFT and SFT+RL pass counts
and the paired McNemar cells (SFT-only, RL-only passes), which fix its whole 2x2 table of
per-game outcomes; the pooled comparison is the same paired statistics (Wilson
intervals, exact McNemar, paired bootstrap) over all the tables' games together
(`rldojo.eval.compare.summary_pairs`, `pool_pairs`). The seeds' runs have their own test
games, so the pooled games are independent.

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

from results_io import RESULTS, add_result_args, write_result  # benchmarks/ is on sys.path

from rldojo.eval.compare import pool_pairs, summary_pairs

# Small committed inputs for the dry mode: reading them is all it does with them.
DRY_INPUTS = [RESULTS / f"agentic_tictactoe_lora_top10_seed{i}.json" for i in range(3)]


def pool(paths: list[Path]) -> dict[str, Any]:
    """The runs pooled, and which runs they were."""
    results = {path.name: json.loads(path.read_text()) for path in paths}
    runs = [{"file": name, "overrides": r["overrides"], "cpu_flags": r["machine"]["cpu_flags"],
             "git": r.get("manifest", {}).get("git")} for name, r in results.items()]  # fmt: skip
    return {"runs": runs, **pool_pairs({k: summary_pairs(r) for k, r in results.items()})}


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
