"""What one rank holds under FSDP2: 1 rank (no sharding) vs 2 ranks, the same SFT-like step.

    python benchmarks/sharded_memory.py [--rows 8] [--seq 256] [--results DIR] [--dry]

Each side is launched by torchrun (`--nproc-per-node 1`, then 2) on this machine, gloo on
the CPU, and runs one step of the model in fp32: a forward and backward of `--rows`
sequences of `--seq` random tokens (split across the ranks), cross-entropy on every
token, an AdamW step. Each rank then counts, from its tensors, the bytes of its
parameters, gradients and optimizer state (local shards under FSDP2:
`rldojo.training.distributed.shard_model`), and reads its peak RSS. The target of the
sharded-training issue: the state bytes of the largest rank at 2 ranks <= 0.55 x the one
process's. Step time at 2 ranks on 2 cores is reported, not targeted. `--dry`:
tiny-random, 2 rows of 16 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import add_result_args, write_result

TARGET = 0.55


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def child(args: argparse.Namespace) -> None:
    """One rank: the step, then what it holds, as JSON in `args.out`/rank_N.json."""
    import torch

    from rldojo.policy.models import load_model
    from rldojo.training.distributed import init_dist, shard_model

    torch.manual_seed(0)
    d = init_dist("auto", torch.device("cpu"), 600)
    model, _ = load_model(args.model)
    model.train()
    if d.sharded:
        shard_model(model, d, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    vocab = model.config.vocab_size
    rows = torch.randint(
        0, vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(1)
    )
    mine = rows[d.rank :: d.world]
    started = time.perf_counter()
    logits = model(input_ids=mine).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), mine[:, 1:].reshape(-1))
    loss.backward()
    params = list(model.parameters())
    grads = _local_bytes(p.grad for p in params if p.grad is not None)
    optimizer.step()
    step_s = time.perf_counter() - started
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    record = {"rank": d.rank, "world": d.world, "param_bytes": _local_bytes(params),
              "grad_bytes": grads, "optimizer_bytes": _local_bytes(state),
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "step_s": step_s}  # fmt: skip
    record["state_bytes"] = record["param_bytes"] + record["grad_bytes"] + record["optimizer_bytes"]
    Path(args.out, f"rank_{d.rank}.json").write_text(json.dumps(record))
    d.close()


def _side(world: int, args: argparse.Namespace, tmp: Path) -> list[dict]:
    out = tmp / f"world_{world}"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world),
               __file__, "--child", "--model", args.model, "--rows", str(args.rows),
               "--seq", str(args.seq), "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
    subprocess.run(command, check=True, env=env, capture_output=True, text=True, timeout=1800)
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank_*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    add_result_args(parser, "tiny-random, 2 rows of 16 tokens, into a temporary folder")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.dry:
        args.model, args.rows, args.seq = "tiny-random", 2, 16
    with tempfile.TemporaryDirectory() as tmp:
        sides = {str(w): _side(w, args, Path(tmp)) for w in (1, 2)}
    one = sides["1"][0]["state_bytes"]
    largest = max(r["state_bytes"] for r in sides["2"])
    values = {"model": args.model, "rows": args.rows, "seq": args.seq, "dtype": "float32",
              "backend": "gloo", "ranks": sides, "state_ratio_2_over_1": largest / one,
              "target": TARGET, "meets_target": largest / one <= TARGET}  # fmt: skip
    label = "dry" if args.dry else f"{args.model}-r{args.rows}-s{args.seq}"
    path = write_result("sharded_memory", label, values, out_dir=args.results, dry=args.dry)
    for world, ranks in sides.items():
        for r in ranks:
            print(f"world {world} rank {r['rank']}: state {r['state_bytes'] / 2**20:.1f} MiB "
                  f"(params {r['param_bytes'] / 2**20:.1f}, grads {r['grad_bytes'] / 2**20:.1f}, "
                  f"AdamW {r['optimizer_bytes'] / 2**20:.1f}), peak RSS "
                  f"{r['peak_rss_mib']:.0f} MiB, step {r['step_s']:.2f} s")  # fmt: skip
    print(f"largest rank at 2 / one process: {largest / one:.3f} (target <= {TARGET}); {path}")


if __name__ == "__main__":
    main()
