"""Peak memory per rank, load included: one process vs 2 FSDP2 ranks, before and after
loading straight into the shards (`rldojo.training.sharded_load`).

    python benchmarks/sharded_memory.py [--layers 16] [--hidden 2048] [--intermediate 8192]
        [--grpo-layers 12,16,20] [--rows 4] [--seq 64] [--results DIR] [--dry]
    python benchmarks/sharded_memory.py --layers 0 --grpo-layers 10,12,14   # GRPO sizes alone

A Llama-shaped model with random weights (`--hidden`, `--layers`, `--intermediate`, 32
heads, 8 KV heads, SmolLM2's tokenizer and 49,152-token vocabulary, tied embeddings;
the defaults make 1.07B parameters) is written as safetensors to a temporary folder, so
every side loads it as a real checkpoint. Each side is its own processes (torchrun
--standalone for 2 ranks, gloo on the CPU, fp32) that load the model and take one step:
a forward and backward of `--rows` sequences of `--seq` random tokens (split across the
ranks), cross-entropy on every token, an AdamW step. Each rank reads its peak resident
set (`VmHWM`) after the load and at the end, and counts its parameter, gradient and AdamW
bytes. The sides:

- `one`: one process, `load_model`, unsharded;
- `before`: 2 ranks, each loads the whole model, then `shard_model` (rldojo until this);
- `after`: 2 ranks, `load_sharded`: each rank reads only its shards from the files.

The target of issue 54: the largest rank's peak at 2 ranks (after) <= 0.6 x one process.

`--grpo-layers`: the same model with that many layers, on 2 ranks, shaped like a GRPO
step: rank 0 also holds a whole copy to sample from (before: `copy.deepcopy` of its
whole model; after: loaded directly), samples 2 x 8 tokens from it before the update,
and after it the shards are gathered into that copy (before: the whole state dict on
rank 0, then `load_state_dict`; after: `gather_into`, one tensor at a time). No
environment, grader or ledger: their memory does not grow with the model. A size
"fits" when the ranks' peaks add up to less than this machine's memory (MemTotal); a
side whose predicted need exceeds the memory available now is not run (recorded as
skipped). `--dry`: a 2-layer model of hidden size 64, 2 rows of 16 tokens, one GRPO
size, into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results_io import add_result_args, write_result

TARGET = 0.6
GIB = 2**30


def _status_mib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _meminfo_gib(key: str) -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _local_bytes(tensors: Any) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _llama(hidden: int, intermediate: int, layers: int) -> tuple[Any, Any]:
    """`(LlamaConfig, tokenizer)` of the benchmark's model: SmolLM2's tokenizer, heads of
    64, a quarter as many KV heads, tied embeddings."""
    from transformers import LlamaConfig

    from rldojo.policy.models import load_tokenizer

    tokenizer = load_tokenizer("tiny-random")  # SmolLM2's
    heads = max(1, hidden // 64)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                         intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return config, tokenizer


def _param_count(args: argparse.Namespace, layers: int) -> int:
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(_llama(args.hidden, args.intermediate, layers)[0])
    return sum(p.numel() for p in model.parameters())


def write_model(args: argparse.Namespace) -> None:
    """The random Llama-shaped model and its tokenizer, as safetensors in `args.write`."""
    import torch
    from transformers import LlamaForCausalLM

    config, tokenizer = _llama(args.hidden, args.intermediate, args.layers)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(args.write)
    tokenizer.save_pretrained(args.write)


def _load(args: argparse.Namespace, d: Any) -> tuple[Any, Any]:
    """`(trained model, rank 0's whole copy or None)` as the side loads them."""
    import copy

    import torch

    from rldojo.config import ModelConfig
    from rldojo.policy.training_model import load_training_model
    from rldojo.training.distributed import shard_model
    from rldojo.training.sharded_load import load_sharded

    cpu, cfg = torch.device("cpu"), ModelConfig(name=args.model)
    if args.side == "after":
        model, _, whole = load_sharded(cfg, None, d, cpu, whole=args.sampler)
        return model, whole
    model, _ = load_training_model(cfg, None, cpu)
    if args.side == "one":
        return model, model if args.sampler else None
    whole = copy.deepcopy(model) if args.sampler and d.main else None
    shard_model(model, d, cpu)
    return model, whole


def _publish(args: argparse.Namespace, model: Any, whole: Any, d: Any) -> None:
    """The trained weights into rank 0's whole copy, as the side does it."""
    from rldojo.training.distributed import full_state_dict, gather_into

    if args.side == "after":
        gather_into(model, whole, d)
    elif args.side == "before":  # rldojo until this: the whole state dict on rank 0
        weights = full_state_dict(model, d)
        if whole is not None:
            whole.load_state_dict(weights)


def child(args: argparse.Namespace) -> None:
    """One rank of one side: load, (sample), one step, (publish); JSON in `args.out`."""
    import torch

    from rldojo.training.distributed import Dist, init_dist

    torch.manual_seed(0)
    d = Dist() if args.side == "one" else init_dist("fsdp", torch.device("cpu"), 3600)
    started = time.perf_counter()
    model, whole = _load(args, d)
    load_s, load_peak = time.perf_counter() - started, _status_mib("VmHWM")
    vocab = model.config.vocab_size
    if whole is not None:  # rank 0 samples the step's completions
        prompts = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            whole.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                           max_new_tokens=8, min_new_tokens=8, do_sample=True)  # fmt: skip
    d.barrier()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    draw = torch.Generator().manual_seed(1)
    rows = torch.randint(0, vocab, (args.rows, args.seq), generator=draw)
    mine = rows[d.rank :: d.world]
    stepped = time.perf_counter()
    logits = model(input_ids=mine).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), mine[:, 1:].reshape(-1))
    loss.backward()
    del logits, loss
    params = list(model.parameters())
    grads = _local_bytes(p.grad for p in params if p.grad is not None)
    optimizer.step()
    if args.sampler:
        _publish(args, model, whole, d)
    step_s = time.perf_counter() - stepped
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    record = {"rank": d.rank, "world": d.world, "load_s": load_s, "step_s": step_s,
              "load_peak_mib": load_peak, "peak_mib": _status_mib("VmHWM"),
              "param_bytes": _local_bytes(params), "grad_bytes": grads,
              "optimizer_bytes": _local_bytes(state), "whole_copy": whole is not None}  # fmt: skip
    Path(args.out, f"rank_{d.rank}.json").write_text(json.dumps(record))
    d.close()


def _predicted_gib(side: str, sampler: bool, params: int) -> float:
    """What a side needs in all (its processes together), roughly: fp32 weights,
    gradients and AdamW's two moments (16 B a parameter), rank 0's copy (4 B) and, before,
    the whole state dict gathered beside it (4 B), 1.5 GiB a process."""
    copies = 0 if not sampler or side == "one" else 4 if side == "after" else 8
    return (16 + copies) * params / GIB + 1.5 * (1 if side == "one" else 2)


def _side(args: argparse.Namespace, model: Path, side: str, sampler: bool, tmp: Path
          ) -> dict[str, Any]:  # fmt: skip
    """One side's processes, to the end: its ranks' records."""
    out = tmp / f"{model.name}-{side}-{int(sampler)}"
    out.mkdir()
    world = 1 if side == "one" else 2
    launcher = [sys.executable]
    if world > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command = [*launcher, __file__, "--child", "--side", side, "--model", str(model),
               "--rows", str(args.rows), "--seq", str(args.seq), "--out", str(out),
               *(["--sampler"] if sampler else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
    env.pop("WORLD_SIZE", None)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        return {"failed": done.returncode, "stderr": done.stderr[-2000:]}
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank_*.json"))]
    peaks = [r["peak_mib"] for r in ranks]
    return {"ranks": ranks, "max_peak_mib": max(peaks), "sum_peak_mib": sum(peaks),
            "wall_s": round(time.perf_counter() - started, 1)}  # fmt: skip


def _model(args: argparse.Namespace, layers: int, tmp: Path) -> Path:
    folder = tmp / f"llama-{args.hidden}h-{layers}l"
    command = [sys.executable, __file__, "--write", str(folder), "--hidden", str(args.hidden),
               "--intermediate", str(args.intermediate), "--layers", str(layers)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=3600)
    return folder


def _sides(args: argparse.Namespace, layers: int, plan: dict[str, bool], tmp: Path
           ) -> dict[str, Any]:  # fmt: skip
    """The sides `plan` names (side: with rank 0's sampler copy) on the model of `layers`
    layers, written once for them (not at all when none can run here)."""
    import shutil

    params = _param_count(args, layers)
    out: dict[str, Any] = {"layers": layers, "params": params}
    folder: Path | None = None
    for side, sampler in plan.items():  # none is started that this machine cannot hold now
        need, free = _predicted_gib(side, sampler, params), _meminfo_gib("MemAvailable")
        if need >= free - 1.0:
            out[side] = {"skipped": f"predicted to need ~{need:.1f} GiB, {free:.1f} available"}
            continue
        folder = folder or _model(args, layers, tmp)
        out[side] = _side(args, folder, side, sampler, tmp)
    if folder is not None:
        shutil.rmtree(folder)
    return out


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The three sides at `args.layers` (none for 0), then the GRPO-shaped sides at each
    size."""
    plain = {"params": None, "one": {}, "before": {}, "after": {}}
    if args.layers:
        plain = _sides(args, args.layers, {"one": False, "before": False, "after": False}, tmp)
    sides = {s: plain[s] for s in ("one", "before", "after")}
    values: dict[str, Any] = {"params": plain["params"], "sides": sides}
    if "max_peak_mib" in sides["one"]:
        for s in ("before", "after"):
            if "max_peak_mib" in sides[s]:
                values[f"ratio_{s}"] = sides[s]["max_peak_mib"] / sides["one"]["max_peak_mib"]
    total = _meminfo_gib("MemTotal") * 1024
    grpo: dict[str, Any] = {}
    for layers in args.grpo_layers:
        row = _sides(args, layers, {"before": True, "after": True}, tmp)
        for s in ("before", "after"):
            if "sum_peak_mib" in row[s]:
                row[s]["fits"] = row[s]["sum_peak_mib"] < total
        grpo[str(layers)] = row
    values["grpo"] = grpo
    values["largest_fitting"] = {
        s: max((r["params"] for r in grpo.values() if r[s].get("fits")), default=None)
        for s in ("before", "after")}  # fmt: skip
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=16, help="0: the GRPO-shaped sizes alone")
    parser.add_argument("--grpo-layers", default="12,16,20",
                        help="layer counts of the GRPO-shaped sizes ('' for none)")  # fmt: skip
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    for hidden in ("--child", "--sampler"):
        parser.add_argument(hidden, action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--side", "--model", "--out", "--write"):
        parser.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    add_result_args(parser, "a 2-layer model of hidden size 64, 2 x 16 tokens, one GRPO size")
    args = parser.parse_args()
    if args.write:
        return write_model(args)
    if args.child:
        return child(args)
    if args.dry:
        args.hidden, args.intermediate, args.layers, args.grpo_layers = 64, 128, 2, "2"
        args.rows, args.seq = 2, 16
    args.grpo_layers = [int(x) for x in args.grpo_layers.split(",") if x]
    with tempfile.TemporaryDirectory(prefix="sharded_memory_") as tmp:
        values = measure(args, Path(tmp))
    settings = {"hidden": args.hidden, "intermediate": args.intermediate, "layers": args.layers,
                "rows": args.rows, "seq": args.seq, "dtype": "float32", "backend": "gloo",
                "mem_total_gib": _meminfo_gib("MemTotal"), "target": TARGET}  # fmt: skip
    after = values.get("ratio_after")
    values["meets_target"] = after is not None and after <= TARGET
    grpo = "-".join(map(str, args.grpo_layers))
    sizes = f"{args.layers}l" if args.layers else f"grpo-{grpo}l"
    label = "dry" if args.dry else f"llama-{args.hidden}h-{sizes}-r{args.rows}-s{args.seq}"
    path = write_result("sharded_memory", label, {**settings, **values}, out_dir=args.results,
                        dry=args.dry)  # fmt: skip
    _print(values, path)


def _print(values: dict[str, Any], path: Path) -> None:
    if values["params"]:
        print(f"model: {values['params'] / 1e9:.3f}B parameters")
    for side, got in values["sides"].items():
        if not got:  # --layers 0
            continue
        if "ranks" not in got:
            print(f"{side}: {got}")
            continue
        for r in got["ranks"]:
            print(f"{side} rank {r['rank']}/{r['world']}: peak after load "
                  f"{r['load_peak_mib']:.0f} MiB, peak {r['peak_mib']:.0f} MiB, load "
                  f"{r['load_s']:.1f} s, step {r['step_s']:.1f} s")  # fmt: skip
    for s in ("before", "after"):
        if f"ratio_{s}" in values:
            ratio = values[f"ratio_{s}"]
            print(f"largest rank / one process, {s}: {ratio:.3f} (target <= {TARGET})")
    for layers, row in values["grpo"].items():
        for s in ("before", "after"):
            got = row[s]
            said = f"sum of peaks {got['sum_peak_mib'] / 1024:.1f} GiB, fits {got['fits']}" \
                if "sum_peak_mib" in got else str(got)[:200]  # fmt: skip
            print(f"GRPO-shaped, {row['params'] / 1e9:.2f}B ({layers} layers), {s}: {said}")
    print(f"largest fitting: {values['largest_fitting']}; {path}")


if __name__ == "__main__":
    main()
