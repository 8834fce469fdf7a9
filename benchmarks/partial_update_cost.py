"""What one policy-update step costs on this machine when fewer weights train: full
fine-tuning vs LoRA on every layer vs LoRA on the top layers only (`model.lora.layers`).

    python benchmarks/partial_update_cost.py [--rows 32] [--tokens 256] [--top 10]
        [--results DIR | --out FILE] [--dry]

The batch is shaped like a tic-tac-toe RL step (rows x tokens, loss on the last 32
positions of each row). Each variant runs the same forward (bf16 autocast where this
machine's precision probe picks it, as the trainer does), backward and AdamW step,
`--repeats` times after one warm-up; reported: median seconds per step and the ratio to
full fine-tuning. Variants alternate within each repeat, so load drift hits all alike.
With LoRA on the top layers only, no parameter below them trains, so autograd's backward
stops there. Writes benchmarks/results/partial_update_cost/default.json (`results_io`), or
--out FILE. `--dry`: tiny-random (2 layers, LoRA on the top one), 2 rows of 40 tokens,
one repeat, into a temporary folder.
"""

from __future__ import annotations

import argparse
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

from rldojo.config import LoraSection  # noqa: E402
from rldojo.hardware.precision import resolve_precision  # noqa: E402
from rldojo.policy.lora import add_lora, trainable_parameters  # noqa: E402
from rldojo.policy.models import SMOLLM2, TINY_RANDOM, load_model  # noqa: E402


def _variants(top: int, layers: int) -> dict[str, LoraSection | None]:
    return {
        "full": None,
        "lora_all": LoraSection(r=16, alpha=32),
        f"lora_top{top}": LoraSection(r=16, alpha=32, layers=list(range(layers - top, layers))),
    }


def _step(model: Any, optimizer: Any, ids: torch.Tensor, bf16: bool) -> float:
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids).logits[:, -33:-1].float()  # [B, 32, V]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, -32:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--top", type=int, default=10, help="layers LoRA trains in lora_topK")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(parser, "tiny-random, 2 rows x 40 tokens, one repeat, a temporary folder")
    args = parser.parse_args()
    model_name = TINY_RANDOM if args.dry else SMOLLM2
    if args.dry:
        args.rows, args.tokens, args.top, args.repeats = 2, 40, 1, 1
    torch.manual_seed(0)
    bf16 = bool(resolve_precision().autocast_bf16)
    models: dict[str, tuple[Any, Any]] = {}
    config = load_model(model_name)[0].config  # the layer count and vocabulary, read
    for name, lora in _variants(args.top, config.num_hidden_layers).items():
        model, _ = load_model(model_name)
        model.train()
        if lora is not None:
            model = add_lora(model, lora, model_name)
        params = trainable_parameters(model)
        models[name] = (model, torch.optim.AdamW(params, lr=1e-6))
    ids = torch.randint(0, config.vocab_size, (args.rows, args.tokens))
    times: dict[str, list[float]] = {name: [] for name in models}
    for repeat in range(args.repeats + 1):
        for name, (model, optimizer) in models.items():
            seconds = _step(model, optimizer, ids, bf16)
            if repeat:  # the first pass is a warm-up
                times[name].append(seconds)
    full = statistics.median(times["full"])
    rows = {
        name: {
            "trainable_params": sum(p.numel() for p in trainable_parameters(models[name][0])),
            "seconds": [round(t, 2) for t in ts],
            "median_s": round(statistics.median(ts), 2),
            "vs_full": round(statistics.median(ts) / full, 3),
        }
        for name, ts in times.items()
    }
    result = {
        "model": model_name,
        "batch": {"rows": args.rows, "tokens": args.tokens, "loss_positions": 32},
        "bf16_autocast": bf16,
        "variants": rows,
        "machine": {
            "cpu_flags": cpu_flags(),
            "threads": torch.get_num_threads(),
            "load_average": load_average(),
        },
    }
    label = "dry" if args.dry else "default"
    path = write_result("partial_update_cost", label, result, out_dir=args.results,
                        path=args.out, seed=0, dry=args.dry)  # fmt: skip
    for name, row in rows.items():
        print(f"{name:>12}: {row['median_s']:.2f} s ({row['vs_full']:.2f}x full), "
              f"{row['trainable_params']:,} trainable")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
