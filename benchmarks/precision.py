"""Step time of the default precision (`auto`) against forced fp32 and forced bf16.

The same quickstart-shaped run (SmolLM2-135M-Instruct on arith-v1, 8 prompts x 8 samples,
48 new tokens, no dynamic-sampling refills so every step does the same work) is trained
for `--steps` timed steps after one untimed warm-up step, three times in one process:
with `model.generation_dtype` / `model.autocast_bf16` left at `auto`, forced to
`float32`/`false`, and forced to `bfloat16`/`true`. The issue's target: `auto` within
1.15x of the faster of the two forced runs (on an AVX2-only CPU that is fp32, on a CPU
with bf16 units usually bf16).

To see the AVX2 decision on a CPU that has AVX-512, cap the kernels torch and oneDNN may
use before torch loads (an approximation: clock and caches stay this CPU's):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/precision.py

On such a CPU forced bf16 is ~30x slower per matmul; `--skip-bf16` leaves that run out.

Usage: python benchmarks/precision.py [--steps 2] [--model smollm2-135m-instruct]
    [--results DIR] [--dry]
Writes benchmarks/results/precision/<capability>[-capped].json (one per CPU kind;
`results_io`). `--dry`: tiny-random, 1 step of 2 x 2 samples, into a temporary folder.
Run on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine_load import cpu_flags  # benchmarks/ is on sys.path
from results_io import add_result_args, write_result  # benchmarks/ is on sys.path

from rldojo.config import load_config
from rldojo.hardware.precision import cached_probe, cpu_capability
from rldojo.training.trainer import Trainer

ENV_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # kernel caps, recorded when set
VARIANTS = {
    "auto": [],
    "fp32": ["model.generation_dtype=float32", "model.autocast_bf16=false"],
    "bf16": ["model.generation_dtype=bfloat16", "model.autocast_bf16=true"],
}


def run(args: argparse.Namespace, name: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        overrides = [
            f"model.name={args.model}",
            "rollout.dynamic_sampling=false",
            f"run.output_dir={out}",
            "eval.tasks=0",
            *args.shrink,
            *VARIANTS[name],
        ]
        trainer = Trainer(load_config(None, overrides), Path(out) / name)
        try:
            trainer.step()  # warm-up: allocator, kernel selection, grader pools
            steps = [trainer.step() for _ in range(args.steps)]
        finally:
            trainer.close()
    return {
        "resolved": trainer.precision.as_dict(),
        "step_s": [m["time/step"] for m in steps],
        "generate_s": [m["time/generate"] for m in steps],
        "train_s": [m.get("time/train", 0.0) for m in steps],  # 0: nothing informative
        "median_step_s": statistics.median(m["time/step"] for m in steps),
        "reward_mean": [m["reward/mean"] for m in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--skip-bf16", action="store_true")
    add_result_args(parser, "tiny-random, 1 step of 2 x 2 samples, a temporary folder")
    args = parser.parse_args()
    args.shrink = (
        ["rollout.prompts_per_step=2", "rollout.group_size=2", "sampling.max_new_tokens=8"]
        if args.dry
        else []
    )
    if args.dry:
        args.model, args.steps = "tiny-random", 1
    started = time.perf_counter()
    probe = cached_probe()
    names = [n for n in VARIANTS if not (args.skip_bf16 and n == "bf16")]
    runs = {name: run(args, name) for name in names}
    forced = {n: runs[n]["median_step_s"] for n in names if n != "auto"}
    best = min(forced, key=forced.__getitem__)
    ratio = runs["auto"]["median_step_s"] / forced[best]
    capability = cpu_capability()
    result = {
        "machine": {
            "cpu_capability": capability,
            "cpu_flags": cpu_flags(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "env": {k: v for k in ENV_CAPS if (v := os.environ.get(k)) is not None},
        },
        "probe_gflops": {"fp32": probe.fp32, "bf16": probe.bf16},
        "settings": {k: v for k, v in vars(args).items() if k != "results"},
        "runs": runs,
        "fastest_forced": best,
        "ratio_auto_over_fastest": ratio,
        "target_ratio": 1.15,
        "wall_s": time.perf_counter() - started,
    }
    capped = "-capped" if any(k in os.environ for k in ENV_CAPS) else ""
    label = f"{capability.lower()}{capped}"  # one file per CPU kind
    path = write_result("precision", label, result, out_dir=args.results, dry=args.dry)
    for name in names:
        r = runs[name]
        resolved = r["resolved"]
        print(f"{name:5s} generation {resolved['generation_dtype']:8s} autocast "
              f"{resolved['autocast_bf16']!s:5s}: median {r['median_step_s']:.1f}s")  # fmt: skip
    print(f"auto / fastest forced ({best}) = {ratio:.2f} (target <= 1.15); wrote {path}")


if __name__ == "__main__":
    main()
