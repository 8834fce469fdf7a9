"""One GRPO step of a real model on 1 rank and on 2 (FSDP2, gloo): how exact is sharding?

    python benchmarks/sharded_exactness.py [--model smollm2-135m-instruct] [--results DIR] [--dry]

`tests/training/test_sharded_rl.py` proves it on `tiny-random`; this runs the same check
on the model users train here. Each side is the real CLI, `rldojo train --nproc N` (N = 1,
then 2), with one config: fp32 (no autocast), deterministic kernels, one thread a rank,
one step of 4 prompts x 4 samples of arith-v1, top-20% forking tokens, two mini-batches
(two optimizer steps). The step's rollouts come from the same weights on both sides, so
they must be the same; then the result records what one process and two ranks made of
them: whether the ledgers' rows (tokens, rewards, which rows trained, the selected
positions) are equal, the advantages' largest difference, the step's gradient norms and
losses on each side (the norm is a function of the whole reduced gradient), and the
largest weight difference after the step (two AdamW steps; AdamW divides by the
gradient's running size, so float summation order shows up in weights whose gradient is
near zero). `--dry`: tiny-random, 3 prompts, 6 new tokens.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from results_io import add_result_args, write_result

SETS = ["env.id=arith-v1", "run.steps=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.dynamic_sampling=false", "sampling.max_new_tokens=48", "loss.rho=0.2",
        "optim.mini_batches=2", "optim.micro_batch_size=2", "model.autocast_bf16=false",
        "model.generation_dtype=float32", "run.deterministic=true", "run.threads=1",
        "eval.tasks=0", "run.report_to=[]"]  # fmt: skip
DRY = ["rollout.prompts_per_step=3", "sampling.max_new_tokens=6"]


def _train(model: str, ranks: int, out: Path, extra: list[str]) -> Path:
    run = out / f"r{ranks}"
    sets = [*SETS, f"model.name={model}", *extra, f"run.output_dir={out}", f"run.name={run.name}"]
    command = [sys.executable, "-m", "rldojo", "train", "--nproc", str(ranks),
               *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"rldojo train on {ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    return run


def _rows(run: Path) -> list[tuple]:
    with sqlite3.connect(run / "ledger.sqlite") as db:
        return db.execute(
            "SELECT task_id, sample_index, completion_ids, score_value, trained, advantage, "
            "selected FROM rollouts ORDER BY task_id, sample_index"
        ).fetchall()


def _metrics(run: Path) -> dict[str, Any]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if r["kind"] == "train")
    keys = ("optim/grad_norm", "optim/grad_norm_max", "loss/policy", "entropy/tokens_selected",
            "entropy/tokens_policy", "rollout/groups_informative", "time/step")  # fmt: skip
    return {k: step.get(k) for k in keys}


def _weight_diff(one: Path, two: Path) -> float:
    from safetensors.torch import load_file

    a, b = (load_file(r / "checkpoints" / "step_000001" / "model.safetensors") for r in (one, two))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def compare(one: Path, two: Path) -> dict[str, Any]:
    """What the two runs agree on (see the module docstring)."""
    r1, r2 = _rows(one), _rows(two)
    same = [x[:5] + x[6:] for x in r1] == [x[:5] + x[6:] for x in r2]
    adv = [abs(a[5] - b[5]) for a, b in zip(r1, r2, strict=True) if a[5] is not None]
    m1, m2 = _metrics(one), _metrics(two)
    norm_rel = abs(m1["optim/grad_norm"] - m2["optim/grad_norm"]) / abs(m1["optim/grad_norm"])
    return {
        "rollouts": len(r1), "rows_trained": sum(1 for x in r1 if x[4]),
        "ledgers_equal": same, "advantage_max_abs_diff": max(adv, default=0.0),
        "grad_norm_rel_diff": norm_rel, "one_rank": m1, "two_ranks": m2,
        "weights_max_abs_diff_after_step": _weight_diff(one, two),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    add_result_args(parser, "tiny-random, 3 prompts, 6 new tokens")
    args = parser.parse_args()
    model = "tiny-random" if args.dry else args.model
    extra = DRY if args.dry else []
    out = Path(tempfile.mkdtemp(prefix="sharded_exactness_"))
    one, two = (_train(model, ranks, out, extra) for ranks in (1, 2))
    values = {"model": model, "config": [*SETS, *extra], **compare(one, two)}
    label = "dry" if args.dry else model.replace("/", "_")
    print(json.dumps(values, indent=2))
    path = write_result("sharded_exactness", label, values, out_dir=args.results, dry=args.dry)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
