"""Which tokens should carry gradient? The ablation of "Beyond the 80/20 Rule" on SmolLM2.

Four arms, trained from the same base with the same seeds, data and budget; only the
tokens that carry gradient differ (`loss.rho`, `loss.select`):

    top20     the 20% highest-entropy policy tokens (the paper's rule, rldojo's default)
    full      every policy token (rho = 1.0, the usual GRPO/DAPO loss)
    random20  a random 20% of the policy tokens (same count as top20, no entropy)
    bottom80  the 80% lowest-entropy tokens (the paper reports this arm degrades)

on two tasks: `arith` (arith-v1 level 1, sums) and `arith-hard` (levels 2 and 3:
products, differences, two operations), `--seeds` seeds each. Every run starts from
SmolLM2-135M-Instruct and trains `--steps` steps of 8 prompts x 4 samples (40 new
tokens, lr 3e-5; groups without signal are dropped, not refilled, so every arm draws the
same tasks), then is evaluated greedily on `--eval-tasks` held-out problems. One
optimizer step per batch: with 2 mini-batches the quickstart learned less (see
`optim.mini_batches`), and the variable under test is which tokens carry gradient.
Recorded per run: held-out accuracy before and after with each problem's outcome (so
arms are compared *paired*, on the same problems and seeds), per step the reward and the
entropy p80 and share of tokens below 0.01 nats, and the overlap of the top-20% entropy
positions of the base and the trained model on the same sequences (the run's own
rollouts, teacher-forced through both).

Per task and arm the results give the accuracy after training pooled over seeds (Wilson
95% interval) and the paired difference to `full` (bootstrap over problems, McNemar).

Resumable: each finished run is written to the results file at once, and a rerun skips
the runs already there (`--fresh` starts over). Sized to finish within an hour on a
2-core CPU (about 2.5 min a run, 24 runs; `--steps`, `--seeds`, `--eval-tasks` resize
it).

Usage: python benchmarks/rho_ablation.py [--steps 7] [--seeds 3] [--eval-tasks 48]
    [--results DIR | --out FILE] [--dry]
Writes benchmarks/results/rho_ablation/default.json (`results_io`; or --out FILE) and the
plot beside it (default.png). `--dry`: tiny-random, arms top20 and full on `arith`, one
seed, 1 step of 2 x 2 samples of 8 tokens, 2 held-out problems, into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_load import cpu_flags, cpu_probe, load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, result_path, write_result

ARMS: dict[str, list[str]] = {
    "top20": ["loss.rho=0.2", "loss.select=highest"],
    "full": ["loss.rho=1.0", "loss.select=highest"],
    "random20": ["loss.rho=0.2", "loss.select=random"],
    "bottom80": ["loss.rho=0.8", "loss.select=lowest"],
}
TASKS: dict[str, list[str]] = {
    "arith": ["env.id=arith-v1", "env.kwargs={levels=[1]}"],
    "arith-hard": ["env.id=arith-v1", "env.kwargs={levels=[2, 3]}"],
}
SHAPE = [
    "model.name=smollm2-135m-instruct", "rollout.prompts_per_step=8", "rollout.group_size=4",
    "sampling.max_new_tokens=40", "rollout.max_extra_rounds=0", "optim.micro_batch_size=16",
    "optim.lr=3e-5",
]  # fmt: skip
DRY_SHAPE = [
    "model.name=tiny-random", "rollout.prompts_per_step=2", "rollout.group_size=2",
    "sampling.max_new_tokens=8", "rollout.max_extra_rounds=0", "optim.lr=3e-5",
]  # fmt: skip


def run_one(task: str, arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One training run; returns its record (see the module docstring)."""
    from rldojo.config import load_config
    from rldojo.policy.models import load_model
    from rldojo.training.entropy_analysis import (
        position_overlap,
        sequences_from_ledger,
        teacher_forced_entropy,
    )
    from rldojo.training.trainer import Trainer

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rho_ablation_") as out:
        overrides = [*args.shape, *TASKS[task], *ARMS[arm], f"run.seed={seed}",
                     f"run.steps={args.steps}", f"eval.tasks={args.eval_tasks}",
                     f"run.output_dir={out}"]  # fmt: skip
        cfg = load_config(None, overrides)
        trainer = Trainer(cfg, Path(out) / "run")
        try:
            before = trainer.evaluate("before")
            steps = []
            for _ in range(args.steps):
                m = trainer.step()
                steps.append({k: m.get(k) for k in (
                    "reward/mean", "reward/pass_rate", "entropy/p80", "entropy/frac_below_0.01",
                    "loss/clip_frac", "rollout/groups_informative", "time/step",
                )})  # fmt: skip
            after = trainer.evaluate("after")
            temperature = cfg.sampling.temperature
            sequences = sequences_from_ledger(Path(out) / "run", limit=args.overlap_sequences)
            trained = teacher_forced_entropy(trainer.model, sequences, temperature=temperature)
        finally:
            trainer.close()
        base_model, _ = load_model(cfg.model.name)
        base = teacher_forced_entropy(base_model, sequences, temperature=temperature)
        overlap = position_overlap(base, trained, sequences, 0.2)
    return {
        "task": task, "arm": arm, "seed": seed,
        "before": {"accuracy": before.accuracy, "passed": [r["passed"] for r in before.rows]},
        "after": {"accuracy": after.accuracy, "passed": [r["passed"] for r in after.rows]},
        "task_ids": [r["task_id"] for r in after.rows],
        "steps": steps, "forking_overlap": overlap,
        "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task and arm: pooled accuracy with a Wilson interval, the paired difference
    to `full`, and the per-step means of the training curves."""
    from rldojo.eval.harness import wilson_interval
    from rldojo.eval.stats import mcnemar, paired_bootstrap

    out: dict[str, Any] = {}
    for task in TASKS:
        out[task] = {}
        by_arm = {arm: sorted((r for r in runs if r["task"] == task and r["arm"] == arm),
                              key=lambda r: r["seed"]) for arm in ARMS}  # fmt: skip
        full = {r["seed"]: r for r in by_arm["full"]}
        for arm, rs in by_arm.items():
            if not rs:
                continue
            passed = [p for r in rs for p in r["after"]["passed"]]
            k, n = sum(passed), len(passed)
            row: dict[str, Any] = {
                "seeds": [r["seed"] for r in rs],
                "accuracy_before": sum(r["before"]["accuracy"] for r in rs) / len(rs),
                "accuracy_after": k / max(n, 1),
                "ci95_after": wilson_interval(k, n),
                "forking_overlap": sum(r["forking_overlap"]["overlap"] for r in rs) / len(rs),
                "curves": {key: [sum(r["steps"][i][key] or 0.0 for r in rs) / len(rs)
                                 for i in range(len(rs[0]["steps"]))]
                           for key in ("reward/mean", "entropy/p80", "entropy/frac_below_0.01")},
            }  # fmt: skip
            pairs = [(a, b) for r in rs if r["seed"] in full
                     for a, b in zip(full[r["seed"]]["after"]["passed"], r["after"]["passed"],
                                     strict=True)]  # fmt: skip
            if arm != "full" and pairs:
                base_p, arm_p = [float(a) for a, _ in pairs], [float(b) for _, b in pairs]
                diff = paired_bootstrap(base_p, arm_p)
                test = mcnemar([bool(a) for a, _ in pairs], [bool(b) for _, b in pairs])
                row["vs_full"] = {"diff": diff.diff, "ci95": list(diff.ci),
                                  "p_bootstrap": diff.p_value, "p_mcnemar": test.p_value,
                                  "pairs": len(pairs)}  # fmt: skip
            out[task][arm] = row
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in summary if summary[t]]
    fig, axes = plt.subplots(len(tasks), 3, figsize=(14, 3.6 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        arms = summary[task]
        ax = axes[row][0]
        names = list(arms)
        after = [arms[a]["accuracy_after"] for a in names]
        lo = [arms[a]["accuracy_after"] - arms[a]["ci95_after"][0] for a in names]
        hi = [arms[a]["ci95_after"][1] - arms[a]["accuracy_after"] for a in names]
        ax.bar(names, after, yerr=[lo, hi], capsize=4, color="tab:blue", alpha=0.8)
        ax.axhline(sum(arms[a]["accuracy_before"] for a in names) / len(names), color="grey",
                   ls="--", label="base")  # fmt: skip
        ax.set_title(f"{task}: held-out accuracy after training (95% CI)")
        ax.set_ylim(0, 1)
        ax.legend()
        for col, key in ((1, "entropy/p80"), (2, "reward/mean")):
            ax = axes[row][col]
            for a in names:
                ys = arms[a]["curves"][key]
                ax.plot(range(1, len(ys) + 1), ys, marker="o", label=a)
            ax.set_title(f"{task}: {key} per step (mean over seeds)")
            ax.set_xlabel("step")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-tasks", type=int, default=48)
    parser.add_argument("--overlap-sequences", type=int, default=32)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    parser.add_argument("--fresh", action="store_true", help="ignore finished runs")
    add_result_args(parser, "tiny-random, 2 arms, 1 seed, 1 step of 2 x 2, 2 problems")
    args = parser.parse_args()
    args.shape = DRY_SHAPE if args.dry else SHAPE
    if args.dry:
        args.steps, args.seeds, args.eval_tasks, args.overlap_sequences = 1, 1, 2, 2
        args.tasks, args.arms = "arith", "top20,full"
    label = "dry" if args.dry else "default"
    args.out = args.out or result_path("rho_ablation", label, args.results, dry=args.dry)
    doc: dict[str, Any] = {"runs": []}
    if args.out.exists() and not args.fresh:
        doc = json.loads(args.out.read_text())
        # A resumed file keeps the runs; the manifest is this run's, and names the last.
        doc["resumed_from"] = doc.pop("manifest", {}).get("git")
    shape = {"steps": args.steps, "eval_tasks": args.eval_tasks, "overrides": args.shape}
    if doc.get("shape", shape) != shape:
        raise SystemExit(f"{args.out} holds runs of another shape {doc['shape']}; use --fresh")
    done = {(r["task"], r["arm"], r["seed"]) for r in doc["runs"]}
    doc |= {"shape": shape, "arms": ARMS, "tasks": TASKS, "machine": {
        "platform": platform.platform(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
        "probe_gflops": round(cpu_probe(), 1)}}  # fmt: skip
    for seed in range(args.seeds):  # seeds outermost: a partial run has every arm of seed 0
        for task in args.tasks.split(","):
            for arm in args.arms.split(","):
                if (task, arm, seed) in done:
                    continue
                load = load_average()
                record = run_one(task, arm, seed, args) | {"load_before": load}
                doc["runs"].append(record)
                doc["summary"] = summarize(doc["runs"])
                write_result("rho_ablation", label, doc, path=args.out, dry=args.dry)
                print(
                    f"{task} {arm} seed {seed}: {record['before']['accuracy']:.1%} -> "
                    f"{record['after']['accuracy']:.1%} in {record['wall_s']:.0f}s "
                    f"(overlap {record['forking_overlap']['overlap']:.2f})",
                    flush=True,
                )
    doc["summary"] = summarize(doc["runs"])
    write_result("rho_ablation", label, doc, path=args.out, dry=args.dry)
    plot(doc["summary"], args.out.with_suffix(".png"))
    print(f"wrote {args.out}")
    print(json.dumps({t: {a: round(v["accuracy_after"], 3) for a, v in arms.items()}
                      for t, arms in doc["summary"].items()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
