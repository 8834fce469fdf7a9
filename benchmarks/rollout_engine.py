"""The two rollout engines side by side, same commit, same seeds, same policy: `lockstep`
(one `generate` call per turn for every live episode, then every environment's answer)
and `episodes` (each episode its own coroutine over the continuously batching inference
engine; `rldojo.rollout.concurrent`). Each plays and grades the same batch of episodes
(`rldojo.rollout.episodes.play_and_grade`, what a training round runs); the engines
alternate within each repeat so load drift hits both alike.

    python benchmarks/rollout_engine.py [--scenario NAME ...] [--repeats 2]
        [--model DIR] [--results DIR | --out FILE] [--dry]

Scenarios:
- `latency`: tiny-random on an environment whose every step waits a uniform 0-400 ms
  (seeded), 16 episodes x 8 turns, and the same environment without the wait. Reported:
  the wall time the latency adds under each engine, and their ratio (target <= 0.5).
- `quickstart`: `rldojo train` with no config (SmolLM2-135M-Instruct on arith-v1): one
  training round, 8 tasks x 8 samples, single turn. Target: episodes <= 1.0x lockstep.
- `crm-v1`, `tictactoe-v1`, `web-crm-v1`: one training round of the recipe in
  examples/agentic_{crm,tictactoe,web_crm}.toml (its env kwargs, batch shape, turns,
  sampling), on the base model or `--model DIR` (an SFT checkpoint plays longer
  episodes). Reported: episodes per hour (target: >= 1.5x lockstep; web-crm-v1 >= 3x).

Per engine and repeat: wall seconds, episodes per hour, policy tokens, turns, passed
episodes, and the engine's counters (mean decode occupancy, busy share). Writes
benchmarks/results/rollout_engine/<scenarios>.json (`results_io`), or --out FILE.
`--dry`: the latency scenario with 4 episodes x 3 turns, waits of 0-40 ms, once.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine_load import cpu_flags, load_average  # noqa: E402
from results_io import add_result_args, write_result  # noqa: E402

from rldojo.config import load_config  # noqa: E402
from rldojo.policy.models import load_model  # noqa: E402
from rldojo.policy.transformers_backend import TransformersPolicy  # noqa: E402
from rldojo.rollout.episodes import play_and_grade  # noqa: E402
from rldojo.rollout.groups import requests as group_requests  # noqa: E402
from rldojo.training.inputs import build_mixture  # noqa: E402
from rldojo.training.resources import resolve_resources  # noqa: E402
from rldojo.types import Observation, SamplingParams, Score, StepResult, Task  # noqa: E402

ENGINES = ("lockstep", "episodes")
RECIPES = {
    "quickstart": None,
    "crm-v1": "examples/agentic_crm.toml",
    "tictactoe-v1": "examples/agentic_tictactoe.toml",
    "web-crm-v1": "examples/agentic_web_crm.toml",
}


class LatencyEnv:
    """`turns` turns whatever the policy says; each step first waits a uniform
    `[0, max_wait_s]`, drawn from `(seed, turn)`, so both engines meet the same waits."""

    def __init__(self, turns: int, max_wait_s: float) -> None:
        self.turns, self.max_wait_s, self.turn, self.rng = turns, max_wait_s, 0, random.Random()

    async def reset(self, task: Task, *, seed: int) -> Observation:
        self.turn, self.rng = 0, random.Random(seed)
        return Observation([{"role": "user", "content": f"Count with me: {task.prompt}"}])

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(self.rng.uniform(0.0, self.max_wait_s))
        self.turn += 1
        done = self.turn >= self.turns
        return StepResult([] if done else [{"role": "user", "content": f"{self.turn}"}], done)

    async def close(self) -> None:
        pass


class LengthGrader:
    name = "length"

    async def grade(self, rollout: Any, task: Task) -> Score:
        return Score(value=float(len(rollout.completion_ids) % 2))


def _play(
    engine: str,
    policy: Any,
    make_env: Any,
    grader: Any,
    reqs: list,
    sampling: Any,
    limits: tuple,
    loop: asyncio.AbstractEventLoop,
) -> dict[str, Any]:
    stats = policy.engine_stats()
    timing: dict[str, float] = {}
    started = time.perf_counter()
    rollouts, scores = loop.run_until_complete(
        play_and_grade(
            make_env,
            policy,
            grader,
            reqs,
            sampling,
            limits=limits,
            engine=engine,
            timing=timing,
        )
    )
    seconds = time.perf_counter() - started
    end = policy.engine_stats()
    d = {k: end[k] - stats.get(k, 0.0) for k in end}
    return {
        "seconds": round(seconds, 3),
        "episodes_per_hour": round(len(rollouts) / seconds * 3600, 1),
        "tokens": sum(sum(r.policy_mask) for r in rollouts),
        "turns": sum(sum(m["role"] == "assistant" for m in r.messages) for r in rollouts),
        "passed": sum(s.value > 0 for s in scores),
        "statuses": {s: sum(r.status == s for r in rollouts) for s in {r.status for r in rollouts}},
        "occupancy": round(d["decode_rows"] / d["decode_steps"], 2) if d["decode_steps"] else None,
        "busy": round(d["busy_s"] / seconds, 3),
    }


def _warm_up(policy: TransformersPolicy, loop: asyncio.AbstractEventLoop) -> None:
    """A short sample through each path, untimed: the first forward passes pay one-time
    costs (kernel selection, allocations) that would count against whichever runs first."""
    warm = SamplingParams(max_new_tokens=8, temperature=0.0)
    prompt = policy.encode_chat([{"role": "user", "content": "Hello"}])
    policy.generate([prompt] * 8, warm)

    async def eight() -> None:
        await asyncio.gather(*(policy.agenerate(prompt, warm) for _ in range(8)))

    loop.run_until_complete(eight())


def _repeat(runs: dict[str, list], repeats: int, play: Any) -> dict[str, Any]:
    for _ in range(repeats):
        for engine in ENGINES:
            row = play(engine)
            runs.setdefault(engine, []).append(row)
            print(
                f"  {engine:>9}: {row['seconds']:.1f} s, {row['episodes_per_hour']:.0f} "
                f"episodes/h, occupancy {row['occupancy']}, {row['turns']} turns",
                flush=True,
            )
    return {
        e: {"median_s": statistics.median(r["seconds"] for r in rs), "runs": rs}
        for e, rs in runs.items()
    }


def latency(args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """Wall time added by uneven environment latency, under each engine."""
    n, turns, wait = (4, 3, 0.04) if args.dry else (16, 8, 0.4)
    model, tokenizer = load_model("tiny-random")
    policy = TransformersPolicy(model, tokenizer)
    tasks = [Task(id=f"count/{i}", prompt=str(i), env="latency") for i in range(n)]
    reqs = [(t, 0, 1000 + i) for i, t in enumerate(tasks)]
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=0)
    out: dict[str, Any] = {"episodes": n, "turns": turns, "max_wait_s": wait}
    for engine in ENGINES:  # warm-up, not timed: the first decode steps pay one-time costs
        _play(
            engine,
            policy,
            lambda: LatencyEnv(turns, 0.0),
            LengthGrader(),
            reqs,
            sampling,
            (30.0, turns + 1, None),
            loop,
        )
    for name, w in (("no_wait", 0.0), ("wait", wait)):
        print(f"latency, {name}:", flush=True)
        out[name] = _repeat(
            {},
            args.repeats,
            lambda e, w=w: _play(  # type: ignore[misc]
                e,
                policy,
                lambda: LatencyEnv(turns, w),
                LengthGrader(),
                reqs,
                sampling,
                (30.0, turns + 1, None),
                loop,
            ),
        )
    added = {e: out["wait"][e]["median_s"] - out["no_wait"][e]["median_s"] for e in ENGINES}
    out["added_s"] = {e: round(s, 3) for e, s in added.items()}
    out["added_ratio"] = round(added["episodes"] / added["lockstep"], 3)
    print(
        f"latency adds {added['lockstep']:.2f} s lockstep, {added['episodes']:.2f} s episodes"
        f" ({out['added_ratio']:.2f}x)"
    )
    return out


def recipe(name: str, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """One training round of a recipe's shape, under each engine."""
    path = RECIPES[name]
    cfg = load_config(
        ROOT / path if path else None, [f"model.name={args.model}"] if args.model else []
    )
    cfg, precision, _threads = resolve_resources(cfg)
    model, tokenizer = load_model(cfg.model.name)
    policy = TransformersPolicy(
        model,
        tokenizer,
        generation_dtype=precision.torch_generation_dtype(),
        prefix_cache_mb=cfg.generation.prefix_cache_mb,
    )
    mixture = build_mixture(cfg)
    ro, s = cfg.rollout, cfg.sampling
    reqs = group_requests(mixture.draw(ro.prompts_per_step), ro.group_size, cfg.run.seed)
    sampling = SamplingParams(s.max_new_tokens, s.temperature, s.top_p, tuple(s.stop), 0)
    limits = (ro.env_timeout_s, ro.max_turns, ro.max_episode_tokens)
    print(f"{name}: {len(reqs)} episodes of {cfg.model.name}", flush=True)
    _warm_up(policy, loop)
    out = _repeat(
        {},
        args.repeats,
        lambda e: _play(
            e, policy, mixture.make_env_for, mixture.grader(), reqs, sampling, limits, loop
        ),
    )
    lock, eps = (statistics.median(r["episodes_per_hour"] for r in out[e]["runs"]) for e in ENGINES)
    return {
        "config": path,
        "model": cfg.model.name,
        "episodes": len(reqs),
        "engines": out,
        "episodes_per_hour_ratio": round(eps / lock, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", choices=["latency", *RECIPES])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", help="the recipes' model (e.g. an SFT checkpoint)")
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(parser, "the latency scenario, 4 episodes x 3 turns, once")
    args = parser.parse_args()
    scenarios = ["latency"] if args.dry else (args.scenario or ["latency"])
    if args.dry:
        args.repeats = 1
    loop = asyncio.new_event_loop()
    results: dict[str, Any] = {}
    for name in scenarios:
        results[name] = latency(args, loop) if name == "latency" else recipe(name, args, loop)
    loop.close()
    result = {
        "scenarios": results,
        "machine": {"cpu_flags": cpu_flags(), "load_average": load_average()},
    }
    label = "dry" if args.dry else "-".join(scenarios)
    path = write_result(
        "rollout_engine", label, result, out_dir=args.results, path=args.out, dry=args.dry
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
