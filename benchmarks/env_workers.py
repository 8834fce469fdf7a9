"""Environment worker processes: what isolation costs per episode, against in-process envs.

    python benchmarks/env_workers.py [--episodes 64] [--turns 4] [--repeats 3]
        [--results DIR] [--dry]

Runs the same crm-v1 episodes (a scripted policy: three tool calls, then an answer, so
every episode has `--turns` environment steps on a real SQLite database) through the
rollout engine with the environments in the trainer's event loop (baseline), then in 1
and 2 worker processes (`rollout.env_workers`). The policy costs nothing, so the times
are the environments' own plus the isolation overhead (pickling, a socket round trip per
call, the worker's event loop). Reports episodes/s, environment calls/s, and the
overhead per call in ms; best of `--repeats`. Writes
benchmarks/results/env_workers/default.json (`results_io`; `--dry`: 4 episodes of 2 turns,
once, into a temporary folder).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from typing import Any

from results_io import add_result_args, write_result  # benchmarks/ is on sys.path

from rldojo.envs.registry import make_env
from rldojo.rollout.env_pool import EnvWorkerPool
from rldojo.rollout.episodes import collect_rollouts
from rldojo.types import Completion, SamplingParams

CALL = '<tool_call>{"name": "search_deals", "arguments": {"query": "renewal"}}</tool_call>'


class ScriptedPolicy:
    """Three tool calls, then an answer; token ids are placeholders."""

    version = 0
    tokenizer = None

    def __init__(self, turns: int) -> None:
        self.turns, self.calls = turns, 0

    def encode_chat(self, messages: Any, tools: Any = None) -> list[int]:
        return [1] * len(messages)

    def generate(self, prompts: Any, sampling: Any) -> list[Completion]:
        self.calls += 1
        text = CALL if self.calls < self.turns else "<answer>done</answer>"
        return [Completion(text, (7,), (-0.5,), "stop", (1.0,)) for _ in prompts]


def run(make: Any, episodes: int, turns: int) -> tuple[float, list[str]]:
    tasks = make_env("crm-v1").tasks("train", seed=0, n=episodes)
    requests = [(t, 0, i) for i, t in enumerate(tasks)]
    started = time.perf_counter()
    rollouts = asyncio.run(
        collect_rollouts(make, ScriptedPolicy(turns), requests, SamplingParams(),
                         max_turns=turns + 1)
    )  # fmt: skip
    return time.perf_counter() - started, [r.status for r in rollouts]


def _factory(pool: EnvWorkerPool | None) -> Any:
    if pool is None:
        return lambda task: make_env("crm-v1")
    return lambda task: pool.make_env("crm-v1", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    add_result_args(parser, "4 episodes of 2 turns, once, into a temporary folder")
    args = parser.parse_args()
    if args.dry:
        args.episodes, args.turns, args.repeats = 4, 2, 1
    calls = args.episodes * (args.turns + 2)  # open+reset, steps, close
    rows: dict[str, Any] = {}
    setups: list[tuple[str, int]] = [("in_process", 0), ("1_worker", 1), ("2_workers", 2)]
    for name, workers in setups:
        pool = EnvWorkerPool(workers) if workers else None
        make = _factory(pool)
        try:
            run(make, 4, args.turns)  # warm-up: workers started, caches filled
            walls, statuses = [], []
            for _ in range(args.repeats):
                wall, statuses = run(make, args.episodes, args.turns)
                walls.append(wall)
        finally:
            if pool is not None:
                pool.close()
        best = min(walls)
        rows[name] = {"workers": workers, "wall_s": walls, "episodes_per_s": args.episodes / best,
                      "env_calls_per_s": calls / best,
                      "statuses": {s: statuses.count(s) for s in set(statuses)}}  # fmt: skip
    base = min(rows["in_process"]["wall_s"])
    for name, row in rows.items():
        row["overhead_ms_per_call"] = 1000 * (min(row["wall_s"]) - base) / calls
        print(f"{name:>10}: {row['episodes_per_s']:7.1f} episodes/s, "
              f"{row['env_calls_per_s']:7.0f} env calls/s, "
              f"overhead {row['overhead_ms_per_call']:+.2f} ms/call, "
              f"{row['statuses']}")  # fmt: skip
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg": os.getloadavg()[0]},
        "settings": {k: v for k, v in vars(args).items() if k != "results"},
        "results": rows,
    }  # fmt: skip
    label = "dry" if args.dry else "default"
    print(f"wrote {write_result('env_workers', label, result, out_dir=args.results, dry=args.dry)}")


if __name__ == "__main__":
    main()
