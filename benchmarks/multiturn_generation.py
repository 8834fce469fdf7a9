"""Multi-turn generation as the trainer runs it: held-out games of a multi-turn env
played by the trainer's transient generation copy, three ways on the same games:

- `before`: no prefix cache, and under LoRA peft's adapter modules beside the weights
  (how generation ran before both changes);
- `merged` (LoRA only): the adapters merged into plain weights, no prefix cache;
- `prefix_cache`: merged under LoRA, plus cross-turn KV reuse (`generation.
  prefix_cache_mb`, default 2048): what `rldojo train` and `rldojo sft` do now.

    python benchmarks/multiturn_generation.py [--config examples/agentic_tictactoe.toml]
        [--model DIR] [--adapter DIR | --no-lora] [--games 128] [--repeats 2]
        [--results DIR | --out FILE] [--dry]

The model is `model.name` of the config (or `--model`, e.g. an SFT checkpoint) with the
config's `model.lora` adapters: loaded from `--adapter` (an RL checkpoint), else fresh
ones whose B matrices get small random values (std 1e-3: a delta of the size RL leaves, so
the variants play nearly the same games); `--no-lora`: the model alone. Each variant plays
the config's held-out evaluation (greedy, the training's episode limits) on the first
`--games` test tasks; variants alternate within each repeat so load drift hits all
alike. Reported per variant: median seconds, prompt tokens reused from the cache,
tokens generated, games won, and the ratio to `before`. Writes
benchmarks/results/multiturn_generation/<config stem>.json (`results_io`), or --out FILE.
`--dry`: tiny-random (LoRA on its top layer), 2 games of at most 16 tokens a turn, once,
into a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine_load import cpu_flags, load_average  # noqa: E402
from results_io import add_result_args, write_result  # noqa: E402

from rldojo.config import load_config  # noqa: E402
from rldojo.policy.lora import add_lora, load_adapter  # noqa: E402
from rldojo.policy.models import load_model  # noqa: E402
from rldojo.policy.transformers_backend import TransformersPolicy  # noqa: E402
from rldojo.training.heldout import heldout_eval  # noqa: E402
from rldojo.training.inputs import build_mixture, pass_threshold  # noqa: E402
from rldojo.training.resources import resolve_resources  # noqa: E402


class CountingPolicy:
    """Forwards to a policy and counts the prompt tokens it gets and the tokens it generates."""

    def __init__(self, inner: TransformersPolicy) -> None:
        self.inner, self.tokens, self.prompt_tokens = inner, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, prompts: Any, sampling: Any) -> Any:
        out = self.inner.generate(prompts, sampling)
        self.prompt_tokens += sum(len(p) for p in prompts)
        self.tokens += sum(len(c.token_ids) for c in out)
        return out


def _model(cfg: Any, model_dir: str | None, adapter: Path | None, lora: bool) -> tuple[Any, Any]:
    base, tokenizer = load_model(model_dir or cfg.model.name)
    if not lora:
        return base, tokenizer
    if adapter is not None:
        return load_adapter(base, adapter, trainable=True), tokenizer
    if cfg.model.lora is None:
        raise SystemExit("the config has no model.lora (pass --no-lora)")
    model = add_lora(base, cfg.model.lora, cfg.model.name)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 1e-3)
    return model, tokenizer


def _variants(model: Any, tokenizer: Any, dtype: Any, lora: bool, cache_mb: int) -> dict[str, Any]:
    def policy(merge: bool, mb: int) -> TransformersPolicy:
        return TransformersPolicy(model, tokenizer, generation_dtype=dtype, transient_copy=True,
                                  merge_lora=merge, prefix_cache_mb=mb)  # fmt: skip

    variants = {"before": policy(False, 0)}
    if lora:
        variants["merged"] = policy(True, 0)
    variants["prefix_cache"] = policy(True, cache_mb)
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples/agentic_tictactoe.toml")
    parser.add_argument("--model", help="base model or full checkpoint (default: model.name)")
    parser.add_argument("--adapter", type=Path, help="an adapter checkpoint to load")
    parser.add_argument("--no-lora", action="store_true", help="the model without adapters")
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(parser, "tiny-random, 2 games of 16 tokens a turn, once")
    args = parser.parse_args()
    dry = ["model.name=tiny-random", "model.lora.layers=[1]", "eval.max_new_tokens=16"]
    if args.dry:  # tiny-random has 2 layers
        args.games, args.repeats = 2, 1
    overrides = [f"eval.tasks={args.games}", *(dry if args.dry else [])]
    cfg, precision, threads = resolve_resources(load_config(args.config, overrides))
    dtype = precision.torch_generation_dtype()
    lora = not args.no_lora
    model, tokenizer = _model(cfg, args.model, args.adapter, lora)
    mixture = build_mixture(cfg)
    grader, threshold = mixture.grader(), pass_threshold(cfg, mixture)
    tasks = list(mixture.test_tasks)[: args.games]
    variants = _variants(model, tokenizer, dtype, lora, cfg.generation.prefix_cache_mb)
    loop = asyncio.new_event_loop()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, policy in variants.items():
            counting = CountingPolicy(policy)
            reused = policy.prefix_cache.reused_tokens if policy.prefix_cache else 0
            started = time.perf_counter()
            result = heldout_eval(cfg, mixture.make_env_for, grader, counting, tasks, threshold,
                                  loop)  # fmt: skip
            seconds = time.perf_counter() - started
            cache = policy.prefix_cache
            row = {"seconds": round(seconds, 2), "tokens": counting.tokens,
                   "prompt_tokens": counting.prompt_tokens,
                   "reused_tokens": (cache.reused_tokens - reused) if cache else 0,
                   "won": round(result.accuracy * len(tasks))}  # fmt: skip
            runs[name].append(row)
            print(f"{name:>12}: {seconds:.1f} s, {row['reused_tokens']}/{row['prompt_tokens']} "
                  f"prompt tokens reused, {row['tokens']} generated, {row['won']}/{len(tasks)} "
                  "won", flush=True)  # fmt: skip
    loop.close()
    base = statistics.median(r["seconds"] for r in runs["before"])
    summary = {}
    for name, rs in runs.items():
        median = statistics.median(r["seconds"] for r in rs)
        summary[name] = {"median_s": round(median, 2), "vs_before": round(median / base, 3),
                         "won": rs[0]["won"], "runs": rs}  # fmt: skip
    config = args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config
    adapter = str(args.adapter) if args.adapter else "fresh, B ~ N(0, 1e-3)"
    result = {
        "config": str(config),
        "model": args.model or cfg.model.name,
        "adapter": adapter if lora else None,
        "lora": cfg.model.lora.model_dump() if lora and cfg.model.lora else None,
        "prefix_cache_mb": cfg.generation.prefix_cache_mb,
        "games": len(tasks),
        "generation_dtype": str(dtype),
        "variants": summary,
        "machine": {
            "cpu_flags": cpu_flags(),
            "threads": threads.torch_threads,
            "load_average": load_average(),
        },
    }
    label = "dry" if args.dry else args.config.stem
    path = write_result("multiturn_generation", label, result, out_dir=args.results,
                        path=args.out, dry=args.dry)  # fmt: skip
    for name, row in summary.items():
        print(f"{name:>12}: {row['median_s']:.1f} s ({row['vs_before']:.2f}x before)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
