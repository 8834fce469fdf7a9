"""Training time with the output layer at the forking tokens only vs at every token.

`optim.selected_logits = true` (the default) runs the vocabulary projection and its
log-softmax only at the tokens that carry gradient (the top-ρ = 20% forking tokens);
`false` computes them at every completion token, as before. Both give the same update
(`tests/training/test_update.py`). This script measures the difference on the quickstart's
shape (SmolLM2-135M-Instruct on arith-v1, 8 prompts x 8 samples, 48 new tokens, the
resolved precision of this machine): one Trainer samples `--batches` batches once, then
`train_on` is timed on exactly those batches for both settings, interleaved `--reps`
times, each from the same weights and optimizer state. It also records how far the two
settings' weights end up apart (float summation order only).

Usage: python benchmarks/selected_logits.py [--batches 2] [--reps 3] [--results DIR] [--dry]
Writes benchmarks/results/selected_logits/default.json (`results_io`). Run on an idle
machine. `--dry`: tiny-random, one batch of 2 x 2 samples, into a temporary folder.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine_load import cpu_flags, cpu_probe, load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, write_result  # benchmarks/ is on sys.path

from rldojo.config import load_config
from rldojo.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    add_result_args(parser, "tiny-random, 1 batch of 2 x 2 samples, once, a temporary folder")
    args = parser.parse_args()
    shrink = (
        ["rollout.prompts_per_step=2", "rollout.group_size=2", "sampling.max_new_tokens=8"]
        if args.dry
        else []
    )
    if args.dry:
        args.model, args.batches, args.reps = "tiny-random", 1, 1
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        overrides = [f"model.name={args.model}", "rollout.dynamic_sampling=false",
                     f"run.output_dir={out}", "eval.tasks=0", *shrink]  # fmt: skip
        trainer = Trainer(load_config(None, overrides), Path(out) / "run")
        try:
            trainer.step()  # warm-up: allocator, kernels, optimizer state
            batches = []
            for _ in range(args.batches):
                groups = (
                    trainer.experience.rollout_source()
                    .collect(trainer.step_num, trainer.policy_updates)
                    .groups
                )
                trainer.step_num += 1  # the next batch: other seeds
                batches.append([g for g in groups if g.informative] or groups)
            weights = copy.deepcopy(trainer.model.state_dict())
            optim = copy.deepcopy(trainer.optimizer.state_dict())
            full = trainer.config.optim.model_copy(update={"selected_logits": False})
            variants = {
                "all_tokens": trainer.config.model_copy(update={"optim": full}),
                "selected_tokens": trainer.config,
            }
            times: dict[str, list[float]] = {name: [] for name in variants}
            final: dict[str, dict[str, torch.Tensor]] = {}
            tokens: dict[str, list[int]] = {}
            for _ in range(args.reps):
                for name, cfg in variants.items():
                    trainer.model.load_state_dict(weights)
                    trainer.optimizer.load_state_dict(optim)
                    trainer.update.config = cfg
                    t0 = time.perf_counter()
                    metrics = [trainer.train_on(groups) for groups in batches]
                    times[name].append(time.perf_counter() - t0)
                    tokens[name] = [m["entropy/tokens_policy"] for m in metrics]
                    final[name] = {k: v.detach().clone()
                                   for k, v in trainer.model.state_dict().items()}  # fmt: skip
            precision = trainer.precision.as_dict()
        finally:
            trainer.close()
    diff = max(float((final["all_tokens"][k] - final["selected_tokens"][k]).abs().max())
               for k in final["all_tokens"])  # fmt: skip
    median = {name: statistics.median(ts) for name, ts in times.items()}
    result = {
        "machine": {
            "cpu_flags": cpu_flags(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_average_end": load_average(),
            "fp32_gflops_probe_end": cpu_probe(),
        },
        "precision": precision,
        "settings": {k: v for k, v in vars(args).items() if k != "results"},
        "policy_tokens_per_batch": tokens["selected_tokens"],
        "train_s": times,
        "median_train_s": median,
        "speedup": median["all_tokens"] / median["selected_tokens"],
        "max_abs_weight_difference": diff,
        "wall_s": time.perf_counter() - started,
    }
    label = "dry" if args.dry else "default"
    path = write_result("selected_logits", label, result, out_dir=args.results, dry=args.dry)
    print(f"train_on over {args.batches} batches: all tokens {median['all_tokens']:.1f}s, "
          f"selected {median['selected_tokens']:.1f}s = {result['speedup']:.2f}x; "
          f"max weight difference {diff:.2e}; wrote {path}")  # fmt: skip


if __name__ == "__main__":
    main()
