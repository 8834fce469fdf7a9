"""How close `rldojo train --dry-run`'s step-time estimate comes to the measured step.

For each config (the quickstart, i.e. the defaults; `examples/code_quickstart.toml`;
`examples/agentic_arith_tools.toml`), in this order and in one process:

1. the dry run (`rldojo.training.dry_run.dry_run`): it calibrates generation and one
   training micro-batch of the run's model on this machine, plays a few episodes of a
   multi-turn environment (`rldojo.training.estimate`) and prices a step; its wall time
   and the load average it was calibrated under are recorded too;
2. a real run of `--steps` steps (`Trainer.step`), each timed by the trainer
   (`time/step`, with `time/generate` and `time/train`).

Both sides run with `rollout.dynamic_sampling = false` (a step is one round, as the
estimate prices it) and no held-out evaluation. The estimate assumes every sample uses
all of `sampling.max_new_tokens` and every group trains; the JSON keeps what the real
steps did (completion length, share cut at the limit, groups trained, the mean turns of
a multi-turn environment's episodes) beside the times.
A multi-turn config is priced at the mean turns of the episodes the calibration played
(`ratio`), and has a range (one turn to every turn); both ends are compared too. The
target: the estimate within 1.5x of the mean measured step (`ratio` = estimate /
measured, between 1/1.5 and 1.5).

    .venv/bin/python benchmarks/estimate_accuracy.py [--steps 2] [--configs quickstart,code]

writes `benchmarks/results/estimate_accuracy/cpu.json` through `results_io` (its manifest:
the machine and CPU flags, versions, git commit and whether the tree was dirty, the
command line, date and wall time; then per config the estimate vs the measured steps).
Run it on an otherwise idle machine: timings of a shared CPU say little. `--dry` runs
every config on `tiny-random` with a tiny step shape and writes into a temporary folder
(or `--results DIR`), never into `results/`.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_load import load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, write_result
from rich.console import Console

from rldojo.config import load_config
from rldojo.training.dry_run import dry_run
from rldojo.training.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
CONFIGS: dict[str, Path | None] = {
    "quickstart": None,  # the defaults: SmolLM2-135M-Instruct on arith-v1
    "code": ROOT / "examples" / "code_quickstart.toml",
    "agentic": ROOT / "examples" / "agentic_arith_tools.toml",
}
COMMON = ["rollout.dynamic_sampling=false", "eval.tasks=0", "eval.before=false"]
DRY = [  # tiny-random, tiny steps: the plumbing, in seconds
    "model.name=tiny-random", "model.autocast_bf16=false", "model.generation_dtype=float32",
    "rollout.prompts_per_step=2", "rollout.group_size=2", "sampling.max_new_tokens=8",
    "optim.micro_batch_size=2", "env.train_tasks=8", "run.threads=1",
]  # fmt: skip
TARGET = 1.5


def estimate(path: Path | None, overrides: list[str]) -> dict[str, Any]:
    """The dry run's plan for the config, and how long the dry run took."""
    started = time.perf_counter()
    printed = io.StringIO()
    plan = dry_run(load_config(path, overrides), Console(file=printed, width=200))
    return {
        "step_s": plan.step_s,
        "one_turn_step_s": plan.one_turn_step_s,
        "all_turns_step_s": plan.all_turns_step_s,
        "turns": plan.turns,
        "played": plan.played,
        "mean_turns": plan.mean_turns,
        "load": plan.load,
        "cores": plan.cores,
        "basis": plan.basis,
        "dry_run_wall_s": time.perf_counter() - started,
        "plan": plan.lines(),
        "warnings": [ln for ln in printed.getvalue().splitlines() if ln.startswith("warning")],
    }


def measure(path: Path | None, overrides: list[str], steps: int, out: Path) -> dict[str, Any]:
    """`steps` real steps of the config; per step its times and what it generated."""
    keys = ("time/step", "time/generate", "time/train", "rollout/completion_len",
            "signal/truncated", "rollout/groups_informative", "rollout/groups",
            "env/episode/turns")  # fmt: skip
    trainer = Trainer(load_config(path, [*overrides, f"run.steps={steps}"]), out)
    try:
        rows = []
        for _ in range(steps):
            metrics = trainer.step()
            rows.append({k: metrics.get(k, 0.0) for k in keys} | {"load": load_average()})
    finally:
        trainer.close()
    return {"steps": rows, "mean_step_s": statistics.mean(r["time/step"] for r in rows)}


def compare(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    path = CONFIGS[name]
    overrides = [*COMMON, *(DRY if args.dry else []), f"run.output_dir={work}"]
    est = estimate(path, overrides)
    real = measure(path, overrides, args.steps, work / name)
    measured = real["mean_step_s"]
    ratios = {"ratio": est["step_s"] / measured}
    if est["turns"] > 1:  # the range: every episode ends after its first turn, or its last
        ratios["ratio_one_turn"] = est["one_turn_step_s"] / measured
        ratios["ratio_all_turns"] = est["all_turns_step_s"] / measured
    within = {k: 1 / TARGET <= r <= TARGET for k, r in ratios.items()}
    return {"config": str(path.relative_to(ROOT)) if path else "defaults",
            "overrides": overrides[:-1], "estimate": est, "measured": real, **ratios,
            "within_target": within}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names")
    add_result_args(parser, "tiny-random and tiny steps, into a temporary folder")
    args = parser.parse_args()
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {list(CONFIGS)}")
    with tempfile.TemporaryDirectory() as work:
        runs = {name: compare(name, args, Path(work)) for name in names}
    values = {"target": f"estimate / measured step within 1/{TARGET}..{TARGET}", "runs": runs}
    out = write_result("estimate_accuracy", "cpu", values, out_dir=args.results, dry=args.dry)
    for name, r in runs.items():
        print(f"{name:10s} estimate {r['estimate']['step_s']:7.1f}s measured "
              f"{r['measured']['mean_step_s']:7.1f}s ratio {r['ratio']:.2f}")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
