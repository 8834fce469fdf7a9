"""The quickstart, recorded: `rldojo train` with the quickstart's budget, then its summary
as a result.

    python benchmarks/quickstart.py [--label NAME] [--set key=value ...] [--nproc N]
                                    [--results DIR] [--dry]

Runs what `rldojo train` runs with no config (SmolLM2-135M-Instruct on arith-v1, 8 x 8
samples a step), held to a first hour's budget (`QUICKSTART`): 12 steps or 3 minutes of
training, whichever ends first, and greedy held-out accuracy on 64 test problems before
and after (`--set` overrides either, as `rldojo train`'s), printing what `rldojo train`
prints, in `runs/quickstart-<label>` (moved aside when it already holds a run). Writes
`benchmarks/results/quickstart/<label>.json` through `results_io`: the manifest (commit,
command, machine, versions, date, wall time) beside the run's summary — held-out accuracy
before and after with 95% intervals, the gain, steps, mean step time, wall time,
precision, threads — and the per-step reward and pass rate from its metrics. `make
quickstart` runs it. The label defaults to the CPU kind (`avx512_bf16`, `avx2`, ...) and
the core count, so runs on other machines sit beside each other.

`--nproc N`: the same run on N ranks of this machine (torchrun, FSDP2: `rldojo train
--nproc N`), labelled `<cpu>-<cores>cores-<N>ranks`; rank 0 writes the result.

`--dry`: tiny-random, 2 steps, 8 held-out problems, into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import results_io

QUICKSTART = ["eval.tasks=64", "run.max_minutes=3"]
"""The quickstart's budget over `rldojo train`'s defaults, so `make quickstart` ends within
10 minutes, install included, on the slowest 2-core CPU seen (an AVX2-only EPYC at ~63 s a
step fits 3 steps): the held-out gain is separated by the 95% intervals after 2 steps there
(fp32: 0/64 -> 17/64; docs/studies/2026-12-07-quickstart-budget.md), and faster CPUs train
more steps in the same 3 minutes."""

DRY = ["model.name=tiny-random", "run.steps=2", "eval.tasks=8", "rollout.prompts_per_step=2",
       "rollout.group_size=2", "sampling.max_new_tokens=8", "run.report_to=[]"]  # fmt: skip


def default_label() -> str:
    """The CPU kind and cores, e.g. `avx512_bf16-2cores` (what decides the quickstart's speed)."""
    flags = results_io.machine()["cpu_flags"]
    kind = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags), "cpu")
    return f"{kind}-{os.cpu_count()}cores"


def per_step(run_dir: Path) -> list[dict[str, Any]]:
    """Each training step's reward, pass rate, informative groups and time, from metrics.jsonl."""
    keys = ("reward/mean", "reward/pass_rate", "rollout/groups_informative", "time/step")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], **{k: r.get(k) for k in keys}} for r in rows
            if r.get("kind") == "train"]  # fmt: skip


def record(summary: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The result's values: what the README quotes, and the per-step curve."""
    before, after = summary["evals"].get("before", {}), summary["evals"].get("after", {})
    gain = None
    if before.get("accuracy") is not None and after.get("accuracy") is not None:
        gain = after["accuracy"] - before["accuracy"]
    return {
        "model": summary["model"], "env": summary["env"], "steps": summary["steps"],
        "accuracy_before": before.get("accuracy"), "ci95_before": before.get("ci95"),
        "accuracy_after": after.get("accuracy"), "ci95_after": after.get("ci95"),
        "heldout_tasks": after.get("n"), "gain": gain, "stopped": summary.get("stopped"),
        "mean_step_s": summary["mean_step_s"], "wall_s": summary["wall_s"],
        "precision": summary["precision"], "threads": summary["threads"],
        "statuses": summary["statuses"], "per_step": per_step(run_dir),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default=None, help="result name (default: the CPU kind)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="config override, as rldojo train --set")  # fmt: skip
    parser.add_argument("--nproc", type=int, default=1,
                        help="train on N ranks of this machine (torchrun, FSDP2)")  # fmt: skip
    results_io.add_result_args(parser, "tiny-random, 2 steps, 8 held-out tasks, temp folder")
    args = parser.parse_args()
    label = args.label or default_label() + (f"-{args.nproc}ranks" if args.nproc > 1 else "")
    if args.nproc > 1 and "RANK" not in os.environ:  # this script again, on the ranks
        skip = {i + 1 for i, a in enumerate(sys.argv) if a == "--nproc"}  # and its value
        argv = [a for i, a in enumerate(sys.argv) if i and i not in skip and a != "--nproc"
                and not a.startswith("--nproc=")]  # fmt: skip
        # (torchrun's parser would take a passed-on --nproc for its own --nproc-per-node)
        return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node", str(args.nproc), __file__, *argv,
                                "--label", label])  # fmt: skip
    from rich.console import Console

    from rldojo.config import load_config
    from rldojo.training.loop import run_training

    started = time.time()
    overrides = [*QUICKSTART, *(DRY if args.dry else []), *args.overrides]
    output = tempfile.mkdtemp(prefix="quickstart_") if args.dry else "runs"
    config = load_config(None, [f"run.output_dir={output}", *overrides])
    run_dir = Path(config.run.output_dir) / f"quickstart-{label}"
    rank0 = int(os.environ.get("RANK", "0")) == 0
    console = Console() if rank0 else None  # what `rldojo train` prints, rank 0's alone
    summary = run_training(config, run_dir=run_dir, overwrite=True, console=console)
    if not rank0:
        return 0  # rank 0 writes the result
    values = record(summary, run_dir) | {"ranks": int(os.environ.get("WORLD_SIZE", "1"))}
    out = results_io.write_result("quickstart", label, values,
                                  out_dir=args.results, seed=config.run.seed,
                                  started=started, dry=args.dry)  # fmt: skip
    print(f"run directory: {run_dir} (rldojo dashboard {config.run.output_dir} shows it)")
    print(f"result: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
