"""Continuous batching vs static chunks: generation wall time for long-tailed completions.

    python benchmarks/continuous_batching.py [--requests 64] [--slots 16] [--max-new-tokens 128]
        [--results DIR] [--dry]

Generates `--requests` completions of arith-v1 prompts (`--group` samples per task, as
the trainer does) at temperature 1.0, which gives RL's long-tailed length distribution
(most completions stop early, a few run to the cap), with the bf16 generation copy of
SmolLM2-135M-Instruct, in one process, in these modes:

* ``static`` (baseline, the behaviour before continuous batching): `slots` rows at a
  time; the next chunk is prefilled only when every row of the previous one has finished
  (`sample(max_batch=slots, refill_at=slots)`, with `requests` a multiple of `slots`).
* ``continuous_refill_K``: `slots` rows at a time; as soon as K slots are free, the next
  prompts are prefilled and join the running decode batch (`refill_at=K`; the default
  of `sample` is `slots // 4`).
* ``batch_all`` (reference): every request in one batch (`max_batch=None`).

All modes use the same seed, and `sample` seeds each prompt's random stream on its own,
so they draw (nearly: bf16 sums differ with the batch) the same completions; tokens/s is
the fair comparison if a few completions differ. Prints wall time, tokens/s, decode
steps and mean decode batch, and the ratio of each mode to the static baseline; writes
``benchmarks/results/continuous_batching/default.json`` (`results_io`; `--dry`:
tiny-random, 4 requests in 2 slots, 8 tokens, into a temporary folder). Wall times
include whatever else runs on the machine: `--repeats` rounds interleave the modes, a
matmul probe before and after each run flags the runs other jobs slowed, and the summary
(medians) leaves those out.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import torch
from machine_load import cpu_probe, load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, write_result

from rldojo.envs.registry import make_env
from rldojo.policy.models import load_model
from rldojo.policy.sampling import sample
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

CLEAN_PROBE = 0.75
"""A run counts as uncontended when the CPU probe around it reaches this share of the best
(as in `vs_trl.py`) ..."""
CLEAN_BUSY = 0.85
"""... and its CPU seconds reach this share of threads x wall seconds: when another job
takes a core mid-run, OpenMP's threads wait for each other and CPU/wall drops towards 1."""


class CountingModel:
    """Wraps the model to count forwards: prefills, decode steps and rows per decode step."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.prefills = 0
        self.decode_rows: list[int] = []
        self.widths: list[int] = []  # attention-mask width (cache columns) per decode step

    def __call__(self, **kwargs: Any) -> Any:
        rows, length = kwargs["input_ids"].shape
        if length > 1:
            self.prefills += 1
        else:
            self.decode_rows.append(rows)
            self.widths.append(kwargs["attention_mask"].shape[1])
        return self.model(**kwargs)


def prompts(policy: TransformersPolicy, tasks: int, group: int) -> list[list[int]]:
    env = make_env("arith-v1")
    ids = [policy.encode_chat(env.prompt_messages(t)) for t in env.tasks("train", n=tasks)]
    return [p for p in ids for _ in range(group)]


def run_mode(
    name: str, model: Any, policy: TransformersPolicy, batch: list[list[int]],
    params: SamplingParams, max_batch: int | None, refill_at: int | None,
) -> dict[str, Any]:  # fmt: skip
    counting = CountingModel(model)
    load_before, probe_before = load_average(), cpu_probe()
    started, cpu_started = time.perf_counter(), time.process_time()
    out = sample(counting, policy.tokenizer, batch, params, policy.eos_ids,
                 max_batch=max_batch, refill_at=refill_at)  # fmt: skip
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    lengths = [len(t) for t in out.token_ids]
    q = statistics.quantiles(lengths, n=20)
    tokens = sum(lengths)
    return {
        "mode": name, "max_batch": max_batch, "refill_at": refill_at,
        "wall_s": wall, "cpu_s": cpu, "tokens": tokens, "tokens_per_s": tokens / wall,
        "completion_len": {"mean": tokens / len(lengths), "p50": q[9], "p95": q[18],
                           "max": max(lengths)},
        "prefills": counting.prefills, "decode_steps": len(counting.decode_rows),
        "mean_decode_batch": statistics.fmean(counting.decode_rows),
        "mean_cache_width": statistics.fmean(counting.widths),
        "load_before": load_before, "load_after": load_average(),
        "probe_gflops": [probe_before, cpu_probe()],
        "token_ids": out.token_ids,
    }  # fmt: skip


def summarise(
    runs: list[dict[str, Any]], names: list[str], threads: int
) -> dict[str, dict[str, float]]:
    """Per mode, over its uncontended rounds (all rounds if none was): medians of the
    times, tokens/s of all those rounds together, and the ratios to static."""
    best = max(g for r in runs for g in r["probe_gflops"])
    for r in runs:
        all_threads = r["cpu_s"] >= CLEAN_BUSY * threads * r["wall_s"]
        r["clean"] = all_threads and min(r["probe_gflops"]) >= CLEAN_PROBE * best
    summary = {}
    for name in names:
        mine = [r for r in runs if r["mode"] == name]
        clean = [r for r in mine if r["clean"]]
        mine = clean or mine
        row = {
            k: statistics.median(r[k] for r in mine)
            for k in ("wall_s", "cpu_s", "tokens", "decode_steps", "mean_decode_batch")
        }
        row["tokens_per_s"] = sum(r["tokens"] for r in mine) / sum(r["wall_s"] for r in mine)
        row["rounds"], row["clean_rounds"] = len(mine), len(clean)
        summary[name] = row
    base = summary["static"]
    for row in summary.values():
        row["wall_ratio_vs_static"] = row["wall_s"] / base["wall_s"]
        row["cpu_ratio_vs_static"] = row["cpu_s"] / base["cpu_s"]
        row["tokens_per_s_ratio_vs_static"] = row["tokens_per_s"] / base["tokens_per_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--refill-at", type=int, nargs="+", default=[4])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all modes")
    parser.add_argument("--skip-batch-all", action="store_true")
    add_result_args(parser, "tiny-random, 2 tasks x 2 samples in 2 slots, 8 tokens")
    args = parser.parse_args()
    if args.dry:
        args.model, args.tasks, args.group, args.slots = "tiny-random", 2, 2, 2
        args.refill_at, args.max_new_tokens = [1], 8
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    model = model.to(torch.bfloat16).eval()  # the trainer generates with a bf16 copy
    policy = TransformersPolicy(model, tokenizer, generation_dtype=None)
    batch = prompts(policy, args.tasks, args.group)
    if len(batch) % args.slots:
        raise SystemExit("--tasks x --group must be a multiple of --slots (static chunks)")
    params = SamplingParams(max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, seed=args.seed)  # fmt: skip
    warm = SamplingParams(max_new_tokens=16, temperature=1.0, seed=1)
    sample(model, tokenizer, batch, warm, policy.eos_ids, max_batch=args.slots)  # not timed
    modes: list[tuple[str, int | None, int | None]] = [("static", args.slots, args.slots)]
    modes += [(f"continuous_refill_{k}", args.slots, k) for k in args.refill_at]
    if not args.skip_batch_all:
        modes.append(("batch_all", None, None))
    runs = []
    for repeat in range(args.repeats):  # rounds interleave the modes: load hits all alike
        for name, mb, ra in modes:
            runs.append({"repeat": repeat, **run_mode(name, model, policy, batch, params, mb, ra)})
    reference = runs[0]["token_ids"]  # static, first round
    for run in runs:
        ids = run.pop("token_ids")
        run["same_completions_as_static"] = sum(a == b for a, b in zip(ids, reference, strict=True))
    summary = summarise(runs, [name for name, _, _ in modes], torch.get_num_threads())
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "settings": {**{k: v for k, v in vars(args).items() if k != "results"},
                     "requests": len(batch), "dtype": "bfloat16"},
        "summary": summary,
        "runs": runs,
    }  # fmt: skip
    label = "dry" if args.dry else "default"
    path = write_result("continuous_batching", label, result, out_dir=args.results,
                        seed=args.seed, dry=args.dry)  # fmt: skip
    for name, row in summary.items():
        speedup = row["tokens_per_s_ratio_vs_static"]
        print(
            f"{name:>22}: {row['wall_s']:6.1f}s {row['tokens']:6.0f} tok "
            f"{row['tokens_per_s']:6.1f} tok/s ({row['decode_steps']:.0f} steps, mean batch "
            f"{row['mean_decode_batch']:.1f}); vs static: tok/s x{speedup:.2f}, "
            f"wall x{row['wall_ratio_vs_static']:.2f}"
        )
    busy = sum(not r["clean"] for r in runs)
    if busy:
        print(f"warning: other jobs slowed {busy} of {len(runs)} runs (CPU probe, CPU/wall); "
              "the summary uses the others where a mode has any")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
