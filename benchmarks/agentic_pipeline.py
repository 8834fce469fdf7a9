"""Agentic RL that learns: base -> SFT on expert demonstrations -> SFT + RL, measured.

For each environment (`arith-tools-v1`, `crm-v1`, `tictactoe-v1`) this runs the
two-stage recipe of `examples/agentic_*.toml` as `rldojo pipeline` does
(`rldojo.training.pipeline.run_pipeline`, in OUT/ENV; a pipeline already there resumes):

    demos (the env's expert) -> SFT (evaluates base, SFT) -> RL from the SFT checkpoint
    (`eval.before=false`: SFT's "after" is its "before")

and pairs the per-task held-out outcomes the runs write (`RUN/evals/*.jsonl`, greedy, the
same test tasks in every stage) to report per stage the success rate with its Wilson 95%
interval, and the paired comparisons base -> SFT and SFT -> SFT+RL on the same tasks
(exact McNemar; paired bootstrap of the difference), and per stage passed/total by kind of
task (`by_kind`: crm's template, arith-tools' level, tic-tac-toe's mark), which shows
whether a gain is a skill learned or a shift between kinds. Also recorded: each stage's wall
time, the demonstrations' pass rate, SFT loss first/last, the machine (CPU flags, load).

Usage: python benchmarks/agentic_pipeline.py [--envs arith-tools-v1 crm-v1 tictactoe-v1]
           [--demos 200] [--set key=value ...] [--rl-set key=value ...]
           [--sft-run DIR] [--out runs/agentic-pipeline] [--tag T] [--results DIR] [--dry]
           [--config TOML] [--from-answers]
Writes benchmarks/results/agentic_pipeline/<env>.json (<env>_<T>.json with --tag; one
file per environment, written when its pipeline ends; `results_io`, --results DIR for
another folder). `--dry`: tiny-random, 8 demos, 2 RL steps of 2 x 2 samples of 16
tokens, 4 test tasks (the smoke run of agentic_gpu.sh), runs and results in temporary
folders; `--set` still overrides it.
With `--set eval.every=N` the RL run's periodic evaluations are in `during_rl`, each
paired with SFT.

`--config TOML` runs that config's environment (its `[env]` id, e.g. reasoning-gym-v1)
in place of the committed recipes; `--from-answers` makes the cold start from the tasks'
own reference answers (`rldojo demos --from-answers`, for environments without an expert):
the demos and SFT run first in OUT/LABEL/answers/, then the pipeline (OUT/LABEL/ENV)
starts RL from that SFT run as with `--sft-run`; the demos' count and wall time are in
`answers_demos`. Every result also holds `paired_by_kind`: per kind of test task, each
stage's success and the paired tests on that kind's tasks alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
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
    "eval.max_new_tokens=16", "sft.batch_size=4", "sft.run.epochs=1", "model.lora.layers=[1]",
    "rollout.prompts_per_step=2", "rollout.group_size=2",
]  # fmt: skip
CONFIGS = {
    "arith-tools-v1": ROOT / "examples" / "agentic_arith_tools.toml",
    "crm-v1": ROOT / "examples" / "agentic_crm.toml",
    "tictactoe-v1": ROOT / "examples" / "agentic_tictactoe.toml",
    "web-crm-v1": ROOT / "examples" / "agentic_web_crm.toml",
}
# The task `info` key whose values split each environment's held-out tasks into kinds.
GROUP_BY = {"arith-tools-v1": "level", "crm-v1": "template", "tictactoe-v1": "mark",
            "reasoning-gym-v1": "dataset", "web-crm-v1": "level"}  # fmt: skip


def run_pipeline(
    env_id: str,
    demos: int,
    overrides: list[str],
    out: Path,
    rl_overrides: Sequence[str] = (),
    sft_run: Path | None = None,
    config: Path | None = None,
) -> dict[str, Any]:
    """One environment's pipeline in OUT/ENV (`rldojo.training.pipeline.run_pipeline`; its
    output in OUT/ENV.log.txt; a pipeline already there resumes): the summary, with the
    environment and the machine. `rl_overrides` apply to the RL stage alone (e.g. LoRA
    there after a full SFT). `sft_run`: start RL from that earlier SFT run instead of
    running demos and SFT again; its SFT wall time is the one it recorded, and the
    demos' (seconds) is not counted. `config`: that TOML in place of the env's recipe."""
    from rich.console import Console

    from rldojo.training.pipeline import run_pipeline as pipeline

    config = (config or CONFIGS[env_id]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load_start = load_average()
    with (out / f"{env_id}.log.txt").open("a") as log:
        summary = pipeline(config, overrides, out / env_id, demos=demos, rl_overrides=rl_overrides,
                           sft_run=sft_run, group_by=GROUP_BY.get(env_id),
                           console=Console(file=log, width=120))  # fmt: skip
    machine = {"cpu_flags": cpu_flags(), "cores": os.cpu_count(), "gpu": gpu_name(),
               "load_start": load_start, "load_end": load_average()}  # fmt: skip
    shown = config.relative_to(ROOT) if config.is_relative_to(ROOT) else config
    paired = paired_by_kind(summary, config, overrides, GROUP_BY.get(env_id))
    return {"env": env_id, **summary, "config": str(shown), "machine": machine,
            "paired_by_kind": paired}  # fmt: skip


def paired_by_kind(
    summary: dict[str, Any], config: Path, overrides: list[str], key: str | None
) -> dict[str, Any]:
    """Per kind of test task (`info[key]`): each stage's success with its Wilson interval
    and the paired tests base -> SFT and SFT -> SFT+RL on that kind's tasks alone (a mix
    of reasoning-gym datasets: one table per dataset)."""
    from rldojo.config import load_config
    from rldojo.eval.compare import paired_comparison, read_outcomes, success_rate
    from rldojo.training.inputs import build_mixture

    if key is None:
        return {}
    tasks = build_mixture(load_config(config, overrides)).test_tasks
    kinds = {t.id: str(t.info.get(key)) for t in tasks}
    sft, rl = Path(summary["runs"]["sft"]), Path(summary["runs"]["rl"])
    stages = {"base": read_outcomes(sft, "before"), "sft": read_outcomes(sft, "after"),
              "sft_rl": read_outcomes(rl, "after")}  # fmt: skip
    out: dict[str, Any] = {}
    for kind in sorted(set(kinds.values())):
        of = {name: None if o is None else {t: v for t, v in o.items() if kinds.get(t) == kind}
              for name, o in stages.items()}  # fmt: skip
        out[kind] = {"success": {name: success_rate(o) for name, o in of.items()},
                     "base_to_sft": paired_comparison(of["base"], of["sft"]),
                     "sft_to_sft_rl": paired_comparison(of["sft"], of["sft_rl"])}  # fmt: skip
    return {"key": key, **out}


def answers_sft(config: Path, demos: int, overrides: list[str], out: Path) -> dict[str, Any]:
    """The cold start from the tasks' reference answers, in OUT (`rldojo demos
    --from-answers` then `rldojo sft`; an SFT run already there is reused): the SFT run
    directory to start RL from, and the demos' episodes, passes and wall time."""
    import time

    from rich.console import Console

    from rldojo.commands.demos import AnswerActor
    from rldojo.config import load_config
    from rldojo.rollout.demos import collect_demos
    from rldojo.training.sft import run_sft

    cfg, sft_dir, data = load_config(config, overrides), out / "sft", out / "demos.jsonl"
    facts_file = out / "demos_facts.json"
    out.mkdir(parents=True, exist_ok=True)
    if not facts_file.exists():
        started = time.perf_counter()
        actor = AnswerActor(cfg.env.id, dict(cfg.env.kwargs))
        try:
            records, stats = asyncio.run(collect_demos(cfg.env.id, cfg.env.kwargs, n=demos,
                                                       actor=actor, keep="all"))  # fmt: skip
        finally:
            asyncio.run(actor.aclose())
        data.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        facts = {"episodes": stats.episodes, "passed": stats.passed,
                 "wall_s": time.perf_counter() - started}  # fmt: skip
        facts_file.write_text(json.dumps(facts))
    if not (sft_dir / "summary.json").exists():
        resume = (sft_dir / "config.toml").exists()
        with (out / "sft.log.txt").open("a") as log:
            run_sft(cfg, data, run_dir=sft_dir, resume=resume, overwrite=not resume,
                    console=Console(file=log, width=120))  # fmt: skip
    return {"sft_run": sft_dir, **json.loads(facts_file.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument(
        "--config", type=Path, help="this TOML's environment in place of --envs' recipes"
    )
    parser.add_argument(
        "--from-answers",
        action="store_true",
        help="cold start from the tasks' reference answers (rldojo demos --from-answers)",
    )
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
    if args.sft_run is not None and (len(args.envs) != 1 or args.from_answers):
        parser.error("--sft-run: name the one environment it was for with --envs "
                     "(and no --from-answers: that makes its own SFT run)")  # fmt: skip
    if args.dry:  # first, so that --set still wins
        args.demos, args.overrides = min(args.demos, 8), [*DRY_OVERRIDES, *args.overrides]
    if args.config is not None:
        from rldojo.config import load_config

        args.envs = [load_config(args.config, args.overrides).env.id]
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="agentic_dry_")) if args.dry else DEFAULT_RUNS
    args.results = results_dir(args.results, dry=args.dry)  # one folder for every env
    for env_id in args.envs:
        stem = env_id.split("-v")[0].replace("-", "_")
        label = f"{stem}_{args.tag}" if args.tag else stem
        sft_run, answers, out = args.sft_run, None, args.out
        if args.from_answers:  # OUT/LABEL: one config's env may run with several tags
            out = args.out / label
            config = args.config or CONFIGS[env_id]
            answers = answers_sft(config, args.demos, args.overrides, out / "answers")
            sft_run = answers.pop("sft_run")
        result = run_pipeline(env_id, args.demos, args.overrides, out, args.rl_overrides,
                              sft_run, args.config)  # fmt: skip
        if answers is not None:
            result["answers_demos"] = answers
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
