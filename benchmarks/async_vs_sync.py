"""Synchronous vs asynchronous (lag 1) training, and rollout throughput with 1 and 2 workers.

Part 1 trains the same model on the same tasks for the same number of steps (so the same
number of trained samples) twice in one run — `rollout.max_policy_lag = 0` and `= 1` —
and compares wall time. Sampling at T = 1.0 with a generous `max_new_tokens` gives the
long-tailed completion-length distribution of RL rollouts (most samples stop early, a
few run to the cap); the per-step length percentiles are recorded to show it.

Part 1b runs lag 1 again with generation in a separate process (one Ray rollout worker
with 1 torch thread) and the trainer on 1 thread: on a 2-core machine, in-process
async generation and training fight for the same cores (torch threads are
process-wide), so overlap only pays when generation has cores of its own.

Part 2 measures graded rollouts per second through the Ray rollout pool with 1 and 2
workers (same requests, same model).

`--generation vllm` compares the vLLM paths instead (needs vllm, and Ray): synchronous
with the engine colocated in the trainer's process, against lag 1 with the engine on one
Ray rollout worker (on a CUDA device it shares the trainer's GPU: `rollout.worker_gpus =
0.5`); the in-process lag-1 run is skipped (a colocated engine is synchronous).

Usage: python benchmarks/async_vs_sync.py [--model smollm2-135m-instruct] [--steps 4]
[--device cpu|cuda|auto] [--generation native|vllm] [--results DIR | --out FILE] [--dry]
Writes benchmarks/results/async_vs_sync/<generation>[_<device>].json (`results_io`), or
`--out FILE` (benchmarks/gpu_check.sh passes one). `--dry`: tiny-random, 1 step of 2 x 4
samples of 8 tokens, no Ray, into a temporary folder. `--device` sets `run.device`
(unset: the config's default); on one GPU, lag 1 overlaps generation and training on it.
Timings are noisy; run on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from results_io import add_result_args, write_result  # benchmarks/ is on sys.path

from rldojo.config import load_config
from rldojo.training.trainer import Trainer


def _overrides(args: argparse.Namespace, out: str) -> list[str]:
    return [
        f"model.name={args.model}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}",
        "rollout.dynamic_sampling=false",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "sampling.temperature=1.0",
        "eval.tasks=0",
        f"run.output_dir={out}",
        *([f"run.device={args.device}"] if args.device else []),
    ]


def completion_lengths(ledger: Path) -> list[int]:
    """Completion length (tokens) of every rollout in the run's ledger, in order."""
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        rows = db.execute("SELECT completion_ids FROM rollouts ORDER BY id").fetchall()
    return [len(json.loads(ids)) for (ids,) in rows]


def train_wall_time(args: argparse.Namespace, lag: int, *extra: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        overrides = [*_overrides(args, out), f"rollout.max_policy_lag={lag}", *extra]
        trainer = Trainer(load_config(None, overrides), Path(out) / f"lag{lag}")
        try:
            trainer.step()  # warm-up (grader pools, allocator), not timed
            started = time.perf_counter()
            steps = [trainer.step() for _ in range(args.steps)]
            wall = time.perf_counter() - started
            lengths = completion_lengths(trainer.ledger.path)
        finally:
            trainer.close()
    q = statistics.quantiles(lengths, n=20)
    return {
        "max_policy_lag": lag,
        "overrides": list(extra),
        "wall_s": wall,
        "trained_samples": sum(int(m.get("train/sequences", 0)) for m in steps),
        "step_s": [m["time/step"] for m in steps],
        "policy_lag": [m.get("rollout/policy_lag", 0) for m in steps],
        "completion_len": {"p50": q[9], "p95": q[18], "max": max(lengths), "n": len(lengths)},
        "reward_mean": [m["reward/mean"] for m in steps],
    }


def _with_ray(fn: Any, *args: Any) -> Any:
    """`fn(*args)` with a local Ray instance up."""
    import ray

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    try:
        return fn(*args)
    finally:
        ray.shutdown()


def rollouts_per_second(args: argparse.Namespace, workers: int) -> dict:
    return _with_ray(_rollouts_per_second, args, workers)  # type: ignore[no-any-return]


def _rollouts_per_second(args: argparse.Namespace, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(None, [*_overrides(args, out), "run.cluster=ray",
                                 f"rollout.workers={workers}"])  # fmt: skip
        trainer = Trainer(cfg, Path(out) / f"w{workers}")
        try:
            assert trainer.experience.ray_pool is not None
            trainer.experience.ray_pool.pids()  # actors up and models loaded before timing
            tasks = trainer.experience.tasks.draw(args.prompts)
            requests = [(t, g, i) for i, t in enumerate(tasks) for g in range(args.group)]
            trainer.experience.ray_pool.publish(trainer.model, 0)
            trainer.experience.ray_pool.run(
                requests[: args.group], trainer.experience.sampling(0), args.group
            )
            started = time.perf_counter()
            rollouts, _ = trainer.experience.ray_pool.run(
                requests, trainer.experience.sampling(1), args.group
            )
            wall = time.perf_counter() - started
        finally:
            trainer.close()
    return {"workers": workers, "rollouts": len(rollouts), "wall_s": wall,
            "rollouts_per_s": len(rollouts) / wall}  # fmt: skip


def _write(args: argparse.Namespace, result: dict[str, Any]) -> Path:
    label = args.generation + (f"_{args.device}" if args.device else "")
    return write_result("async_vs_sync", label, result, out_dir=args.results, path=args.out,
                        dry=args.dry)  # fmt: skip


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("results", "out")}


def main_vllm(args: argparse.Namespace) -> None:
    """`--generation vllm`: colocated and synchronous vs on a Ray worker at lag 1."""
    vllm = ["generation.backend=vllm", "loss.entropy_source=trainer"]
    sync = train_wall_time(args, 0, *vllm)
    on_gpu = (args.device or "auto") != "cpu" and torch.cuda.is_available()
    share = ["rollout.worker_gpus=0.5"] if on_gpu else ["rollout.worker_threads=1", "run.threads=1"]
    async_ = _with_ray(train_wall_time, args, 1, *vllm, "run.cluster=ray", "rollout.workers=1",
                       *share)  # fmt: skip
    ratio = async_["wall_s"] / sync["wall_s"]
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, "cuda": on_gpu},
        "settings": _settings(args), "sync_vllm_colocated": sync,
        "async_lag1_vllm_ray_worker": async_, "wall_ratio_async_over_sync": ratio,
        "target_ratio": 0.7,
    }  # fmt: skip
    path = _write(args, result)
    print(
        f"vLLM colocated, sync {sync['wall_s']:.1f}s; vLLM on a Ray worker, lag 1 "
        f"{async_['wall_s']:.1f}s: ratio {ratio:.2f} (target <= 0.70); wrote {path}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--skip-workers", action="store_true")
    parser.add_argument("--device", default=None, help="run.device (default: the config's)")
    parser.add_argument("--generation", choices=("native", "vllm"), default="native")
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(parser, "tiny-random, 1 step of 2 x 4 samples of 8 tokens, no Ray")
    args = parser.parse_args()
    if args.dry:
        args.model, args.steps, args.prompts, args.group = "tiny-random", 1, 2, 4
        args.max_new_tokens, args.skip_workers = 8, True
    if args.generation == "vllm":
        main_vllm(args)
        return
    sync = train_wall_time(args, 0)
    async_ = train_wall_time(args, 1)
    split = None
    if not args.skip_workers:  # generation in its own process: one core each
        split = _with_ray(train_wall_time, args, 1, "run.cluster=ray", "rollout.workers=1",
                          "rollout.worker_threads=1", "run.threads=1")  # fmt: skip
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "settings": _settings(args),
        "sync": sync,
        "async_lag1": async_,
        "wall_ratio_async_over_sync": async_["wall_s"] / sync["wall_s"],
        "target_ratio": 0.7,
    }  # fmt: skip
    if split is not None:
        result["async_lag1_ray_1_generation_worker"] = split
        result["wall_ratio_async_ray_over_sync"] = split["wall_s"] / sync["wall_s"]
    if not args.skip_workers:
        result["rollout_workers"] = [rollouts_per_second(args, w) for w in (1, 2)]
    path = _write(args, result)
    print(f"sync {sync['wall_s']:.1f}s, async(lag 1) {async_['wall_s']:.1f}s for "
          f"{sync['trained_samples']}/{async_['trained_samples']} trained samples: "
          f"ratio {result['wall_ratio_async_over_sync']:.2f} (target <= 0.70)")  # fmt: skip
    if split is not None:
        ratio = result["wall_ratio_async_ray_over_sync"]
        print(f"async(lag 1), generation on 1 Ray worker (1 thread), training on 1 thread: "
              f"{split['wall_s']:.1f}s, ratio {ratio:.2f}")  # fmt: skip
    for w in result.get("rollout_workers", []):
        print(f"ray workers={w['workers']}: {w['rollouts_per_s']:.2f} rollouts/s")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
