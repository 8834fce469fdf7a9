"""vLLM on the CPU vs rldojo's native sampler: generation tokens/s, and vLLM's weight reload.

    .venv/bin/python benchmarks/vllm_cpu.py [--batches 8 64] [--max-new-tokens 128]
        [--results DIR] [--dry]

Needs `.venv-vllm` (`make test-vllm` builds it). Each side runs in a child process of its
own virtualenv, one after the other, so they never share the cores:

* ``native`` (baseline): `TransformersPolicy`, rldojo's cached decode loop
  (`policy/sampling.py`), under `.venv`. Not under `.venv-vllm`: vllm-cpu pins
  transformers<5.20, where the decode loop's `cache=` argument is not yet understood and
  is silently dropped (each step would see one token, fast and wrong).
* ``vllm``: `VLLMPolicy`, an in-process `vllm.LLM` (vllm-cpu, compiled: its default;
  the start-up time, compilation included, is recorded), under `.venv-vllm`.

Both load SmolLM2-135M-Instruct from the same safetensors export, generate in the dtype
`model.generation_dtype = "auto"` picks on this machine (bf16 where the CPU has bf16
units), and get the same prompts: arith-v1 train tasks, each repeated 8 times as a GRPO
group, at temperature 1.0 with seed 0 and at most `--max-new-tokens` new tokens. Both
stop at end-of-sequence, so tokens/s counts the tokens each side actually generated
(the mean completion length is recorded beside it). The vLLM side then reloads the
trainer's weights `--reloads` times (`update_weights`: merge, hand over, drop the prefix
cache). Each side gets `--threads` torch threads (default: every core).

Writes ``benchmarks/results/vllm_cpu/default.json`` (`results_io`): per side and batch
size the wall time, tokens, tokens/s, mean length and the 1-minute load average before
and after (other work on the machine inflates wall times); the ratio vllm / native per
batch size; the reload times; the CPU's `lscpu` flags and the package versions of each
side. `--dry`: tiny-random, one batch of 8, 8 tokens, one reload, into a temporary
folder; without `.venv-vllm` the native side alone (the vLLM side is recorded as
skipped).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_load import cpu_flags, load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, write_result

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"native": ROOT / ".venv", "vllm": ROOT / ".venv-vllm"}
GROUP = 8


def side_main(args: argparse.Namespace) -> dict[str, Any]:
    """One side's measurements, in this process (the child)."""
    import torch
    import transformers

    from rldojo.envs.registry import make_env
    from rldojo.hardware import resolve_precision
    from rldojo.policy.models import load_model
    from rldojo.types import SamplingParams

    torch.set_num_threads(args.threads)  # before vLLM starts: it makes this a no-op
    dtype = resolve_precision(autocast_bf16=False).torch_generation_dtype()
    model, tokenizer = load_model(args.model)
    model.eval()
    t0 = time.perf_counter()
    if args.side == "native":
        from rldojo.policy.transformers_backend import TransformersPolicy

        policy: Any = TransformersPolicy(model, tokenizer, generation_dtype=dtype)
        versions = {}
    else:
        import vllm

        from rldojo.policy.vllm_backend import VLLMPolicy

        policy = VLLMPolicy(model, tokenizer, dtype=str(dtype).removeprefix("torch."))
        versions = {"vllm": vllm.__version__}
    start_s = time.perf_counter() - t0
    env = make_env("arith-v1")
    tasks = env.tasks("train", n=max(args.batches) // GROUP)
    prompts = [policy.encode_chat(env.prompt_messages(t)) for t in tasks for _ in range(GROUP)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    policy.generate(prompts[:2], SamplingParams(max_new_tokens=8, seed=1))  # warm-up
    runs = []
    for batch in args.batches:
        load_before = load_average()
        t0 = time.perf_counter()
        out = policy.generate(prompts[:batch], params)
        wall = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for c in out)
        runs.append({"batch": batch, "wall_s": round(wall, 3), "tokens": tokens,
                     "tokens_per_s": round(tokens / wall, 1),
                     "mean_len": round(tokens / batch, 1),
                     "load_before": load_before, "load_after": load_average()})  # fmt: skip
        print(f"{args.side:6s} batch {batch:3d}: {tokens / wall:6.1f} tok/s "
              f"({tokens} tokens, {wall:.1f} s)", file=sys.stderr)  # fmt: skip
    reloads = []
    if args.side == "vllm":
        for _ in range(args.reloads):
            t0 = time.perf_counter()
            policy.update_weights()
            reloads.append(round(time.perf_counter() - t0, 3))
        policy.close()
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]
    return {
        "side": args.side, "start_s": round(start_s, 1), "runs": runs, "reload_s": reloads,
        "dtype": str(dtype), "threads": args.threads, "prompts_sha256": digest,
        "versions": versions | {"torch": torch.__version__,
                                "transformers": transformers.__version__},
    }  # fmt: skip


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    python = VENVS[side] / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} missing: `make install` / `make test-vllm` build it")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{side}.json"
        cmd = [str(python), __file__, "--side", side, "--out", str(out), "--model", args.model,
               "--threads", str(args.threads), "--max-new-tokens", str(args.max_new_tokens),
               "--reloads", str(args.reloads), "--batches", *map(str, args.batches)]  # fmt: skip
        env = os.environ | {"TQDM_DISABLE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        subprocess.run(cmd, env=env, check=True)
        return dict(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=sorted(VENVS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reloads", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--model", default="smollm2-135m-instruct", help=argparse.SUPPRESS)
    add_result_args(parser, "tiny-random, one batch of 8, 8 tokens, 1 reload; native alone "
                    "without .venv-vllm")  # fmt: skip
    args = parser.parse_args()
    if args.side:  # a child: one side, its JSON to --out
        args.out.write_text(json.dumps(side_main(args)))
        return
    if args.dry:
        args.model, args.batches, args.max_new_tokens, args.reloads = "tiny-random", [8], 8, 1
    started = time.perf_counter()
    names = ["native", "vllm"]
    skipped = {}
    if args.dry and not (VENVS["vllm"] / "bin" / "python").exists():
        names, skipped = ["native"], {"vllm": f"{VENVS['vllm']} missing (a dry run goes on)"}
    sides = {side: run_side(side, args) for side in names}
    ratios = {}
    if "vllm" in sides:
        if sides["native"]["prompts_sha256"] != sides["vllm"]["prompts_sha256"]:
            raise SystemExit("the two sides tokenized different prompts")
        ratios = {
            str(n["batch"]): round(v["tokens_per_s"] / n["tokens_per_s"], 2)
            for n, v in zip(sides["native"]["runs"], sides["vllm"]["runs"], strict=True)
        }
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    flags = next((ln.split(":", 1)[1].split() for ln in lscpu.splitlines()
                  if ln.startswith("Flags")), [])  # fmt: skip
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines()
                  if ln.startswith("Model name")), platform.processor())  # fmt: skip
    result = {
        "settings": {"model": args.model, "env": "arith-v1", "group": GROUP,
                     "batches": args.batches, "max_new_tokens": args.max_new_tokens,
                     "temperature": 1.0, "seed": 0, "threads": args.threads},
        "machine": {"cpu": model, "cores": len(os.sched_getaffinity(0)),
                    "vector_flags": cpu_flags(), "lscpu_flags": flags},
        "sides": sides,
        "skipped": skipped,
        "tokens_per_s_ratio_vllm_over_native": ratios,
        "reload_s_median": statistics.median(sides.get("vllm", {}).get("reload_s") or [0.0]),
        "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    label = "dry" if args.dry else "default"
    path = write_result("vllm_cpu", label, result, out_dir=args.results, seed=0, dry=args.dry)
    print(json.dumps({"ratio_vllm_over_native": ratios,
                      "reload_s_median": result["reload_s_median"]}))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
