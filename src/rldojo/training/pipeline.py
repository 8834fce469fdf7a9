"""The agentic recipe as one call: demonstrations -> SFT -> RL -> the stages compared.

`run_pipeline(config, overrides, run_dir)` is what `rldojo pipeline` and
`benchmarks/agentic_pipeline.py` call. Every stage reads the same config (the TOML and
its `--set` overrides):

1. demos: the config's environment (`[env]` id and kwargs) played by its expert
   (`rldojo.rollout.demos.collect_demos`, as `rldojo demos CONFIG` plays it), every
   episode kept; SFT trains on the passing ones (`sft.only_passed`).
2. SFT (`rldojo.training.sft.run_sft`) on them: it evaluates the base model ("before") and
   its own checkpoint ("after").
3. RL (`rldojo.training.loop.run_training`) from the SFT checkpoint (`model.name`; an SFT
   checkpoint that holds a LoRA adapter is merged into its base first, PIPE/sft-merged/)
   with `eval.before = false`: SFT's "after" is its starting accuracy, on the same tasks.
4. The summary: success per stage and the paired tests base -> SFT -> SFT+RL by task id
   (`rldojo.eval.compare`).

Pipeline directory:

    PIPE/pipeline.json   the state: config, overrides, and the stages completed (each with
                         its wall time and what it made)
    PIPE/demos.jsonl     the demonstrations (demo records, `rldojo.rollout.demos`)
    PIPE/sft/            the SFT run directory (`rldojo.training.sft`)
    PIPE/rl/             the RL run directory (`rldojo.training.loop`)
    PIPE/summary.json    the comparison (`summarize`; written again by every run)

Running it again resumes: completed stages are skipped, and a stage that was interrupted
goes on in its run directory (`resume=True`). `overwrite` moves an old pipeline aside
(`PIPE.old-DATE`, never deleted) and starts over.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from rldojo.config import ConfigError, TrainConfig, apply_overrides, load_config
from rldojo.config.base import format_error
from rldojo.eval.compare import by_kind, paired_comparison, read_outcomes, success_rate
from rldojo.store.files import write_atomically
from rldojo.store.run_dir import RunDirError

__all__ = ["STAGES", "STATE_FILE", "default_pipeline_dir", "run_pipeline", "summarize"]

STAGES = ("demos", "sft", "rl")
"""The stages in order; PIPE/pipeline.json's `done` holds those completed."""
STATE_FILE = "pipeline.json"
SETTINGS = ("config", "overrides", "rl_overrides", "demos")
"""What the state records of the call that started the pipeline (a resume that changes
one is told so: the stages already completed are kept as they are)."""


def run_pipeline(
    config: str | os.PathLike[str] | TrainConfig,
    overrides: Sequence[str] = (),
    run_dir: Path | None = None,
    *,
    demos: int = 100,
    rl_overrides: Sequence[str] = (),
    sft_run: Path | None = None,
    group_by: str | None = None,
    overwrite: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run (or resume) the pipeline of `config` with `overrides` in `run_dir` (default
    `default_pipeline_dir`); returns the summary (also PIPE/summary.json).

    `demos`: expert episodes to play. `rl_overrides` apply to the RL stage alone (e.g.
    LoRA there after a full-weight SFT). `sft_run`: an earlier SFT run directory to start
    RL from, in place of the demos and SFT stages. `group_by`: the test tasks' `info` key
    whose values split them into kinds (`by_kind` in the summary). Bad input raises
    `ConfigError` or `RunDirError` before any stage starts; a stage that stops early
    raises its `RunStopped` (the state then says which stages completed)."""
    console = console or Console()
    source = "config" if isinstance(config, TrainConfig) else str(config)
    cfg = _configure(config, list(overrides))
    _with_overrides(cfg, list(rl_overrides), "--rl-set")  # checked before any stage
    pipe = (run_dir or default_pipeline_dir(cfg)).resolve()
    settings = {
        "config": source,
        "overrides": list(overrides),
        "rl_overrides": list(rl_overrides),
        "demos": demos,
    }
    if sft_run is None and "demos" not in _done_before(pipe, overwrite):
        _check_expert(cfg)
    console.print(f"[bold]rldojo pipeline[/] {source} -> {pipe}", soft_wrap=True)
    state = _open(pipe, settings, overwrite=overwrite, console=console)
    if sft_run is not None and "sft" not in state["done"]:
        _reuse_sft(pipe, state, sft_run.resolve())
    stages = {
        "demos": lambda: _demos_stage(cfg, pipe, demos),
        "sft": lambda: _sft_stage(cfg, pipe, console),
        "rl": lambda: _rl_stage(cfg, list(rl_overrides), pipe, state, console),
    }
    for stage in STAGES:
        if stage in state["done"]:
            console.print(f"pipeline: {stage} completed before; skipped", soft_wrap=True)
            continue
        console.print(f"pipeline: {stage} ...", soft_wrap=True)
        started = time.perf_counter()
        record = stages[stage]()
        _free_the_stage()
        _mark(pipe, state, stage, {**record, "wall_s": time.perf_counter() - started})
    summary = summarize(pipe, cfg, group_by)
    write_atomically(pipe / "summary.json", json.dumps(summary, indent=2))
    return summary


def _free_the_stage() -> None:
    """The stage's model, before the next stage loads one, and the heap it freed (glibc
    keeps it: after SFT on 2,000-token web-crm-v1 episodes the process held 18.5 GiB)."""
    from rldojo.training.update import release_freed_memory

    gc.collect()
    release_freed_memory()


def default_pipeline_dir(config: TrainConfig) -> Path:
    """`run.output_dir/run.name-pipeline` (a timestamp when the config names no run)."""
    name = config.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(config.run.output_dir) / f"{name}-pipeline"


def _configure(config: str | os.PathLike[str] | TrainConfig, overrides: list[str]) -> TrainConfig:
    if isinstance(config, TrainConfig):
        return _with_overrides(config, overrides, "config")
    return load_config(Path(config), overrides)


def _with_overrides(cfg: TrainConfig, overrides: list[str], source: str) -> TrainConfig:
    """`cfg` with `section.key=value` overrides applied (a `ConfigError` naming `source`)."""
    if not overrides:
        return cfg
    data = apply_overrides(cfg.model_dump(mode="json"), overrides)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_error(source, exc, TrainConfig)) from None


def _check_expert(cfg: TrainConfig) -> None:
    """The demos stage can play this config's environment (one line otherwise)."""
    from rldojo.envs.experts import expert_for

    if cfg.env.mix:
        raise ConfigError(
            "env.mix: the demos stage plays one environment; set env.id and "
            "env.kwargs (or give an SFT run to start RL from)"
        )
    try:
        expert_for(cfg.env.id, **cfg.env.kwargs)
    except ValueError as exc:
        raise ConfigError(f"env: {exc}") from None


# ------------------------------------------------------------------ the state


def _done_before(pipe: Path, overwrite: bool) -> dict[str, Any]:
    path = pipe / STATE_FILE
    if overwrite or not path.exists():
        return {}
    return dict(json.loads(path.read_text()).get("done", {}))


def _open(pipe: Path, settings: dict[str, Any], *, overwrite: bool, console: Console) -> dict:
    """The state to go on from: the one in `pipe` (a resume), or a new one. A directory
    that holds files but no pipeline state is refused unless `overwrite` moves it aside."""
    path = pipe / STATE_FILE
    if pipe.is_dir() and any(pipe.iterdir()):
        if overwrite:
            aside = _move_aside(pipe)
            console.print(
                f"--overwrite: the pipeline that was in {pipe} is now in {aside}", soft_wrap=True
            )
        elif not path.exists():
            raise RunDirError(
                f"{pipe}: holds files but no {STATE_FILE} (not a pipeline): "
                "another --run-dir, or --overwrite to move it aside"
            )
        else:
            old = json.loads(path.read_text())
            changed = [k for k in SETTINGS if old.get(k) != settings[k]]
            if changed:
                kept = ", ".join(old["done"]) or "none"
                console.print(
                    f"resume: {', '.join(changed)} changed; the stages completed ({kept}) are kept",
                    soft_wrap=True,
                )
            return {**settings, "done": old.get("done", {})}
    pipe.mkdir(parents=True, exist_ok=True)
    state = {**settings, "done": {}}
    write_atomically(path, json.dumps(state, indent=2))
    return state


def _move_aside(pipe: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    aside, n = pipe.with_name(f"{pipe.name}.old-{stamp}"), 1
    while aside.exists():
        aside, n = pipe.with_name(f"{pipe.name}.old-{stamp}-{n}"), n + 1
    pipe.rename(aside)
    return aside


def _mark(pipe: Path, state: dict[str, Any], stage: str, record: dict[str, Any]) -> None:
    state["done"][stage] = record
    write_atomically(pipe / STATE_FILE, json.dumps(state, indent=2))


def _reuse_sft(pipe: Path, state: dict[str, Any], sft_run: Path) -> None:
    """Mark demos and SFT completed by the earlier run `sft_run` (its recorded wall time)."""
    summary = json.loads((sft_run / "summary.json").read_text())
    state["done"].setdefault("demos", {"file": summary["data"], "reused": True, "wall_s": None})
    _mark(
        pipe,
        state,
        "sft",
        {
            "run": str(sft_run),
            "checkpoint": summary["checkpoint"],
            "reused": True,
            "wall_s": summary["wall_s"],
        },
    )


# ------------------------------------------------------------------ the stages


def _demos_stage(cfg: TrainConfig, pipe: Path, n: int) -> dict[str, Any]:
    from rldojo.rollout.demos import collect_demos

    records, stats = asyncio.run(collect_demos(cfg.env.id, cfg.env.kwargs, n=n, keep="all"))
    out = pipe / "demos.jsonl"
    write_atomically(out, "".join(json.dumps(r, default=str) + "\n" for r in records))
    return {"file": str(out), "episodes": stats.episodes, "passed": stats.passed}


def _sft_stage(cfg: TrainConfig, pipe: Path, console: Console) -> dict[str, Any]:
    """SFT on PIPE/demos.jsonl in PIPE/sft (resumed when a run was interrupted there)."""
    from rldojo.training.sft import run_sft

    run_dir = pipe / "sft"
    resume = (run_dir / "config.toml").exists()
    if resume:
        console.print(f"pipeline: resuming the SFT run in {run_dir}", soft_wrap=True)
    summary = run_sft(
        cfg,
        pipe / "demos.jsonl",
        run_dir=run_dir,
        resume=resume,
        overwrite=not resume,
        console=console,
    )
    return {"run": str(run_dir), "checkpoint": summary["checkpoint"]}


def _rl_stage(
    cfg: TrainConfig, rl_overrides: list[str], pipe: Path, state: dict[str, Any], console: Console
) -> dict[str, Any]:
    """RL from the SFT checkpoint in PIPE/rl (resumed when a run was interrupted there),
    without evaluating the checkpoint again: SFT's "after" is its "before"."""
    from rldojo.training.loop import run_training

    start = _rl_start(Path(state["done"]["sft"]["checkpoint"]), pipe, console)
    model = cfg.model.model_copy(update={"name": start})
    evals = cfg.eval.model_copy(update={"before": False})
    rl_cfg = _with_overrides(
        cfg.model_copy(update={"model": model, "eval": evals}), rl_overrides, "--rl-set"
    )
    run_dir = pipe / "rl"
    resume = (run_dir / "config.toml").exists()
    if resume:
        console.print(f"pipeline: resuming the RL run in {run_dir}", soft_wrap=True)
    run_training(rl_cfg, run_dir=run_dir, resume=resume, overwrite=not resume, console=console)
    return {"run": str(run_dir), "model": start}


def _rl_start(checkpoint: Path, pipe: Path, console: Console) -> str:
    """The model RL starts from: the SFT checkpoint, or, when it holds a LoRA adapter
    (`model.lora`, unless `[sft.model] lora = "none"`), the adapter merged into its base
    (PIPE/sft-merged), which RL wraps in fresh adapters (`model.lora`)."""
    from rldojo.policy.lora import export_checkpoint, is_adapter_dir

    if not is_adapter_dir(checkpoint):
        return str(checkpoint)
    merged = pipe / "sft-merged"
    if not (merged / "config.json").exists():
        tmp = pipe / ".sft-merged.tmp"
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        export_checkpoint(checkpoint, tmp, merge=True)
        tmp.rename(merged)  # whole or absent: a merge cut short is redone
        console.print(f"pipeline: the SFT adapter merged into its base: {merged}", soft_wrap=True)
    return str(merged)


# ------------------------------------------------------------------ the summary


def summarize(pipe: Path, cfg: TrainConfig | None = None, group_by: str | None = None) -> dict:
    """The comparison of the stages of the completed pipeline in `pipe`: demos, SFT and RL
    facts, success per stage (base: SFT's "before"; sft: its "after"; sft_rl: RL's
    "after"), the paired tests base -> SFT and SFT -> SFT+RL, RL's periodic evaluations
    paired with SFT (`eval.every`), wall times; with `cfg` and `group_by`, passed/total
    per kind of test task (`info[group_by]`)."""
    state = json.loads((pipe / STATE_FILE).read_text())
    done = state["done"]
    sft_dir, rl_dir = Path(done["sft"]["run"]), Path(done["rl"]["run"])
    sft = json.loads((sft_dir / "summary.json").read_text())
    rl = json.loads((rl_dir / "summary.json").read_text())
    lines = [json.loads(x) for x in Path(sft["data"]).read_text().splitlines() if x.strip()]
    stages = {
        "base": read_outcomes(sft_dir, "before"),
        "sft": read_outcomes(sft_dir, "after"),
        "sft_rl": read_outcomes(rl_dir, "after"),
    }
    periodic = sorted(  # eval.every: step_4, step_8, ... (by step)
        (f.stem for f in (rl_dir / "evals").glob("step_*.jsonl")), key=lambda x: int(x[5:])
    )
    walls = {stage: done[stage].get("wall_s") for stage in STAGES}
    summary: dict[str, Any] = {
        **{k: state[k] for k in SETTINGS if k != "demos"},
        "sft_reused": done["sft"]["run"] if done["sft"].get("reused") else None,
        "demos": {
            "episodes": len(lines),
            "passed": sum(bool(x["passed"]) for x in lines),
            "trained_on": sft["demonstrations"],
            "left_out": sft["left_out"],
        },
        "sft": {
            k: sft[k]
            for k in ("steps", "loss_first", "loss_last", "assistant_tokens", "turn_budget")
        },
        "rl": {
            "steps": rl["steps"],
            "mean_step_s": rl.get("mean_step_s"),
            "stopped": rl.get("stopped"),
            "rollouts": rl.get("rollouts"),
            "statuses": rl.get("statuses"),
        },
        "success": {stage: success_rate(o) for stage, o in stages.items()},
        "paired": {
            "base_to_sft": paired_comparison(stages["base"], stages["sft"]),
            "sft_to_sft_rl": paired_comparison(stages["sft"], stages["sft_rl"]),
        },
        "during_rl": {
            label: {"rate": success_rate(o), "vs_sft": paired_comparison(stages["sft"], o)}
            for label in periodic
            if (o := read_outcomes(rl_dir, label)) is not None
        },
        "wall_s": {**walls, "total": sum(w for w in walls.values() if w is not None)},
        "runs": {"sft": str(sft_dir), "rl": str(rl_dir)},
    }
    if cfg is not None and group_by is not None:
        from rldojo.training.inputs import build_mixture

        kinds = {t.id: str(t.info.get(group_by)) for t in build_mixture(cfg).test_tasks}
        summary["by_kind"] = {"key": group_by, **by_kind(kinds, stages)}
    return summary
