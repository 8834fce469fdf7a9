"""Agentic RL that learns: base -> SFT on expert demonstrations -> SFT + RL, measured.

For each environment (`arith-tools-v1`, `crm-v1`, `tictactoe-v1`) this runs the
two-stage recipe of `examples/agentic_*.toml` with the commands a user types:

    rldojo demos ENV --n N --out OUT/ENV/demos.jsonl --env-kwargs '<[env] kwargs>'
    rldojo sft examples/agentic_X.toml --data OUT/ENV/demos.jsonl    (evaluates base, SFT)
    rldojo train examples/agentic_X.toml --set model.name=<SFT checkpoint> \
        --set eval.before=false                                           (SFT+RL)

and reads the per-task held-out outcomes the runs write (`RUN/evals/*.jsonl`, greedy, the
same test tasks in every stage) to report per stage the success rate with its Wilson 95%
interval, and the paired comparisons base -> SFT and SFT -> SFT+RL on the same tasks
(exact McNemar; paired bootstrap of the difference), and per stage passed/total by kind of
task (`by_kind`: crm's template, arith-tools' level, tic-tac-toe's mark), which shows
whether a gain is a skill learned or a shift between kinds. Also recorded: each stage's wall
time, the demonstrations' pass rate, SFT loss first/last, the machine (CPU flags, load).

Usage: python benchmarks/agentic_pipeline.py [--envs arith-tools-v1 crm-v1 tictactoe-v1]
           [--demos 200] [--set key=value ...] [--rl-set key=value ...]
           [--sft-run DIR] [--out runs/agentic-pipeline] [--tag T] [--results DIR] [--dry]
Writes benchmarks/results/agentic_pipeline/<env>.json (<env>_<T>.json with --tag; one
file per environment, written when its pipeline ends; `results_io`, --results DIR for
another folder). `--dry`: tiny-random, 8 demos, 2 RL steps of 2 x 2 samples of 16
tokens, 4 test tasks (the smoke run of agentic_gpu.sh), runs and results in temporary
folders; `--set` still overrides it.
With `--set eval.every=N` the RL run's periodic evaluations are in `during_rl`, each
paired with SFT.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine_load import cpu_flags, gpu_name, load_average  # benchmarks/ is on sys.path
from results_io import add_result_args, results_dir, write_result

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNS = ROOT / "runs" / "agentic-pipeline"
# The smoke run of agentic_gpu.sh --dry: every stage on tiny-random (2 layers) in seconds.
DRY_OVERRIDES = [
    "model.name=tiny-random", "run.device=cpu", "run.threads=1", "run.steps=2",
    "eval.every=1", "eval.tasks=4", "eval.before_tasks=2", "sampling.max_new_tokens=16",
    "eval.max_new_tokens=16", "sft.batch_size=4", "sft.epochs=1", "model.lora.layers=[1]",
    "rollout.prompts_per_step=2", "rollout.group_size=2",
]  # fmt: skip
CONFIGS = {
    "arith-tools-v1": ROOT / "examples" / "agentic_arith_tools.toml",
    "crm-v1": ROOT / "examples" / "agentic_crm.toml",
    "tictactoe-v1": ROOT / "examples" / "agentic_tictactoe.toml",
}


def _rldojo(args: list[str], log: Path) -> float:
    """Run one rldojo command (output appended to `log`); its wall time in seconds."""
    started = time.perf_counter()
    with log.open("a") as f:
        f.write(f"\n$ rldojo {' '.join(args)}\n")
        f.flush()
        proc = subprocess.run(
            [sys.executable, "-m", "rldojo.cli", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"rldojo {args[0]} failed (exit {proc.returncode}); see {log}")
    return time.perf_counter() - started


def _outcomes(run_dir: Path, label: str) -> dict[str, bool] | None:
    """Per-task held-out outcomes of one evaluation (None: the run did not make it, e.g.
    `--set sft.eval_before=false`, when the base model's accuracy is known already)."""
    path = run_dir / "evals" / f"{label}.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {r["task_id"]: bool(r["passed"]) for r in rows}


def _rate(outcomes: dict[str, bool] | None) -> dict[str, Any] | None:
    if outcomes is None:
        return None
    from rldojo.eval.harness import wilson_interval

    k, n = sum(outcomes.values()), len(outcomes)
    lo, hi = wilson_interval(k, n)
    return {"passed": k, "n": n, "rate": k / max(n, 1), "ci95": [lo, hi]}


# The task `info` key whose values split each environment's held-out tasks into kinds.
GROUP_BY = {"arith-tools-v1": "level", "crm-v1": "template", "tictactoe-v1": "mark"}


def _by_kind(
    config: Path, overrides: list[str], key: str, stages: dict[str, dict[str, bool] | None]
) -> dict[str, Any]:
    """Passed/total per value of the test tasks' `info[key]`, per stage: where a stage's
    gain (or loss) lies, e.g. which crm templates RL moved. The tasks are the ones the
    runs evaluated (the same config, overrides and seed)."""
    from rldojo.config import load_config
    from rldojo.train.preflight import build_mixture

    tasks = build_mixture(load_config(config, overrides)).test_tasks
    kind = {t.id: str(t.info.get(key)) for t in tasks}
    out: dict[str, Any] = {"key": key}
    for stage, outcomes in stages.items():
        if outcomes is None:
            continue
        counts: dict[str, list[int]] = {}
        for task_id, passed in outcomes.items():
            c = counts.setdefault(kind.get(task_id, "?"), [0, 0])
            c[0], c[1] = c[0] + passed, c[1] + 1
        out[stage] = {k: f"{v[0]}/{v[1]}" for k, v in sorted(counts.items())}
    return out


def _paired(a: dict[str, bool] | None, b: dict[str, bool] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None
    from rldojo.eval.stats import mcnemar, paired_bootstrap

    common = sorted(set(a) & set(b))
    xa, xb = [a[t] for t in common], [b[t] for t in common]
    m = mcnemar(xa, xb)
    boot = paired_bootstrap([float(x) for x in xa], [float(x) for x in xb], seed=0)
    return {
        "n": len(common),
        "diff": boot.diff,
        "diff_ci95": list(boot.ci),
        "bootstrap_p": boot.p_value,
        "mcnemar": {"a_only": m.a_only, "b_only": m.b_only, "p_value": m.p_value},
    }


def _demos_and_sft(
    env_id: str, demos: int, set_args: list[str], work: Path, log: Path
) -> tuple[float, float, Path]:
    """`rldojo demos` then `rldojo sft`: their wall times and the SFT run's directory."""
    config = CONFIGS[env_id]
    data = tomllib.loads(config.read_text())
    demo_file = work / "demos.jsonl"
    kwargs = json.dumps(data["env"].get("kwargs", {}))
    demo_args = ["--n", str(demos), "--out", str(demo_file), "--env-kwargs", kwargs]
    t_demos = _rldojo(["demos", env_id, *demo_args, "--keep", "all"], log)
    t_sft = _rldojo(["sft", str(config), "--data", str(demo_file), *set_args], log)
    return t_demos, t_sft, work / f"{data['run']['name']}-sft"


def run_pipeline(
    env_id: str,
    demos: int,
    overrides: list[str],
    out: Path,
    rl_overrides: Sequence[str] = (),
    sft_run: Path | None = None,
) -> dict[str, Any]:
    """One environment's pipeline. `rl_overrides` apply to the RL stage alone (e.g.
    LoRA there after a full SFT). `sft_run`: start RL from that earlier SFT run of this
    pipeline instead of running demos and SFT again; its SFT wall time is the one it
    recorded, and the demos' (seconds) is not counted."""
    config = CONFIGS[env_id]
    name = tomllib.loads(config.read_text())["run"]["name"]
    work = out / env_id
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    sets = [f"run.output_dir={work}", *overrides]
    set_args = [a for s in sets for a in ("--set", s)]
    started, load_start = time.perf_counter(), load_average()
    if sft_run is None:
        t_demos, t_sft, sft_dir = _demos_and_sft(env_id, demos, set_args, work, log)
    else:
        sft_dir, t_demos = sft_run, None
        t_sft = json.loads((sft_dir / "summary.json").read_text())["wall_s"]
    sft = json.loads((sft_dir / "summary.json").read_text())
    lines = [json.loads(x) for x in Path(sft["data"]).read_text().splitlines()]
    # The SFT run evaluated its checkpoint ("after"); RL starts from it without again.
    rl_sets = [*set_args, "--set", f"model.name={sft['checkpoint']}", "--set", "eval.before=false"]
    rl_sets += [a for s in rl_overrides for a in ("--set", s)]
    t_rl = _rldojo(["train", str(config), *rl_sets], log)
    rl_dir = work / name
    rl = json.loads((rl_dir / "summary.json").read_text())
    base, after_sft = _outcomes(sft_dir, "before"), _outcomes(sft_dir, "after")
    after_rl = _outcomes(rl_dir, "after")
    periodic = sorted(  # eval.every: step_4, step_8, ... (by step)
        (f.stem for f in (rl_dir / "evals").glob("step_*.jsonl")), key=lambda x: int(x[5:])
    )
    return {
        "env": env_id,
        "config": str(config.relative_to(ROOT)),
        "overrides": overrides,
        "rl_overrides": list(rl_overrides),
        "sft_reused": None if sft_run is None else str(sft_run),
        "demos": {
            "episodes": len(lines),
            "passed": sum(bool(x["passed"]) for x in lines),
            "trained_on": sft["demonstrations"],
            "left_out": sft["left_out"],
        },
        "sft": {
            "steps": sft["steps"],
            "loss_first": sft["loss_first"],
            "loss_last": sft["loss_last"],
            "assistant_tokens": sft["assistant_tokens"],
            "turn_budget": sft["turn_budget"],
        },
        "rl": {
            "steps": rl["steps"],
            "mean_step_s": rl["mean_step_s"],
            "stopped": rl.get("stopped"),  # "max_minutes": run.max_minutes ended it
            "rollouts": rl["rollouts"],
            "statuses": rl["statuses"],
        },
        "success": {
            "base": _rate(base),
            "sft": _rate(after_sft),
            "sft_rl": _rate(after_rl),
        },
        "paired": {
            "base_to_sft": _paired(base, after_sft),
            "sft_to_sft_rl": _paired(after_sft, after_rl),
        },
        "by_kind": _by_kind(
            config,
            overrides,
            GROUP_BY[env_id],
            {"base": base, "sft": after_sft, "sft_rl": after_rl},
        ),
        "during_rl": {
            label: {"rate": _rate(o), "vs_sft": _paired(after_sft, o)}
            for label in periodic
            if (o := _outcomes(rl_dir, label)) is not None
        },
        "wall_s": {
            "demos": t_demos,
            "sft": t_sft,
            "rl": t_rl,
            "total": time.perf_counter() - started + (0.0 if sft_run is None else t_sft),
        },
        "machine": {
            "cpu_flags": cpu_flags(),
            "cores": os.cpu_count(),
            "gpu": gpu_name(),
            "load_start": load_start,
            "load_end": load_average(),
        },
        "runs": {"sft": str(sft_dir), "rl": str(rl_dir)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--demos", type=int, default=200, help="expert episodes per env")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        help="override for both stages, e.g. run.steps=8",
    )
    parser.add_argument(
        "--rl-set",
        dest="rl_overrides",
        action="append",
        default=[],
        help="override for the RL stage alone, e.g. model.lora={r = 16, alpha = 32}",
    )
    parser.add_argument(
        "--sft-run",
        type=Path,
        help="RL from this earlier SFT run directory (one env) instead of demos + SFT again",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directories (default: runs/agentic-pipeline; with --dry a temporary folder)",
    )
    parser.add_argument(
        "--tag", default="", help="results go to <env>_<tag>.json (a variant's file)"
    )
    add_result_args(parser, "tiny-random, 8 demos, 2 RL steps of 2 x 2, 4 test tasks")
    args = parser.parse_args()
    if args.sft_run is not None and len(args.envs) != 1:
        parser.error("--sft-run: name the one environment it was for with --envs")
    if args.dry:  # first, so that --set still wins
        args.demos, args.overrides = min(args.demos, 8), [*DRY_OVERRIDES, *args.overrides]
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="agentic_dry_")) if args.dry else DEFAULT_RUNS
    args.results = results_dir(args.results, dry=args.dry)  # one folder for every env
    for env_id in args.envs:
        result = run_pipeline(
            env_id, args.demos, args.overrides, args.out, args.rl_overrides, args.sft_run
        )
        stem = env_id.split("-v")[0].replace("-", "_")
        label = f"{stem}_{args.tag}" if args.tag else stem
        path = write_result("agentic_pipeline", label, result, out_dir=args.results,
                            dry=args.dry)  # fmt: skip
        s, p = result["success"], result["paired"]["sft_to_sft_rl"]
        mcnemar_p = p["mcnemar"]["p_value"]
        print(
            f"{env_id}: base {s['base']['rate']:.1%} -> SFT {s['sft']['rate']:.1%} -> "
            f"SFT+RL {s['sft_rl']['rate']:.1%} (SFT->RL McNemar p={mcnemar_p:.3g}); "
            f"{result['wall_s']['total'] / 60:.1f} min -> {path}"
        )


if __name__ == "__main__":
    main()
