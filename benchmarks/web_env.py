"""web-crm-v1 through its real headless Chromium: the cost of an action, what the agent
reads, the browser's start-up and memory, and the expert's pass rate per level.

    python benchmarks/web_env.py [--tasks 200] [--timing-episodes 16]
        [--concurrency 1 4 8] [--results DIR] [--dry]

The scripted expert (`rldojo.envs.web_crm.expert`) plays every episode through
`WebCrmEnv` and `rldojo.rollout.demos.play_episode`, with a fresh environment per
episode, `asyncio.gather`-ed on one event loop under a concurrency limit; the browser is
the process's shared pool (`shared_pool()`: one Chromium, a context per episode).

* ``timing``: per concurrency (1, 4, 8 episodes at once) the same `--timing-episodes`
  tasks (levels 1-4 in turn): the wall time of `env.step` for a turn of exactly one
  browser action (that action plus the observation after it: what the issue calls
  "action + observation"), median and p90, per step of several actions the time per
  action, actions per second over the whole run, and the statuses (all must be ``ok``);
* ``observation``: each page the agent read (the env's replies), in characters and in
  SmolLM2 tokens (the default model's tokenizer, from its safetensors export), median
  and max;
* ``pool``: a fresh `BrowserPool`: launch + first context + first observation, then the
  resident memory of Chromium (browser process and all its descendants, from /proc:
  RSS summed, and PSS, which shares shared pages out) with 0, 1, 4 and 8 contexts open,
  per context over the browser with none;
* ``pass_rate``: the expert on `--tasks` train tasks per level (levels separately,
  8 at once): passed/total with a Wilson 95% interval, per template, statuses, and
  actions per episode (median, max).

Targets (issue): median action + observation <= 100 ms (one episode at a time);
8 concurrent episodes with no status other than ``ok``. The JSON records each.

Writes ``benchmarks/results/web_env/<cpu kind>-<N>cores.json`` (`results_io`);
``--dry``: 2 tasks per level, 4 timing episodes at 1 and 2 at once, 2 contexts for
memory, into a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import results_io  # benchmarks/ is on sys.path
from machine_load import load_average

from rldojo.envs.registry import make_env
from rldojo.envs.web_crm.expert import make_expert
from rldojo.eval.harness import wilson_interval
from rldojo.graders.base import passed
from rldojo.rollout.demos import episode_status, play_episode
from rldojo.types import Task

TARGET_ACTION_MS = 100.0
"""Median act + observe of one action, one episode at a time (the issue's target)."""
TARGET_CONCURRENCY = 8
"""Episodes at once that must finish without an error status (the issue's target)."""
LEVELS = (1, 2, 3, 4)


class TimedEnv:
    """Wraps an env: every `step` timed with the number of browser actions in its turn."""

    def __init__(self, env: Any, steps: list[tuple[int, float]]) -> None:
        self._env, self._steps = env, steps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def step(self, action: str) -> Any:
        """The wrapped env's step; (actions, seconds) appended when it ran an action."""
        t0 = time.perf_counter()
        result = await self._env.step(action)
        calls = action.count("<tool_call>")
        if calls and not result.done:
            self._steps.append((calls, time.perf_counter() - t0))
        return result


def quantiles_ms(values: list[float]) -> dict[str, float | None]:
    """Median and p90 of `values` (seconds) in milliseconds."""
    if not values:
        return {"median_ms": None, "p90_ms": None, "n": 0}
    p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
    return {"median_ms": 1000 * statistics.median(values), "p90_ms": 1000 * p90,
            "n": len(values)}  # fmt: skip


async def play_all(tasks: list[Task], concurrency: int) -> dict[str, Any]:
    """The expert on `tasks`, `concurrency` episodes at once; per episode its record,
    and every timed step."""
    expert, steps = make_expert(), []
    limit = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> dict[str, Any]:
        async with limit:
            env = make_env("web-crm-v1", levels=[task.info["level"]])
            try:
                episode = await play_episode(TimedEnv(env, steps), expert.act, task, 0,
                                             max_turns=40, timeout_s=60.0)  # fmt: skip
            finally:
                await env.close()
        replies = [m["content"] for m in episode.rollout.messages[2:] if m["role"] == "tool"]
        return {
            "level": task.info["level"], "template": task.info["template"],
            "status": episode_status(episode), "passed": passed(episode.score),
            "actions": int(episode.rollout.info.get("tool/calls", 0) or 0),
            "pages": [r for r in replies if "Page: " in r],
        }  # fmt: skip

    t0 = time.perf_counter()
    episodes = await asyncio.gather(*(one(t) for t in tasks))
    return {"episodes": episodes, "steps": steps, "wall_s": time.perf_counter() - t0}


def timing_summary(run: dict[str, Any]) -> dict[str, Any]:
    """Step times of one run: single-action steps, time per action of longer turns,
    actions per second and statuses."""
    single = [s for calls, s in run["steps"] if calls == 1]
    per_action = [s / calls for calls, s in run["steps"]]
    actions = sum(e["actions"] for e in run["episodes"])
    statuses = Counter(e["status"] for e in run["episodes"])
    return {
        "action_plus_observe": quantiles_ms(single),
        "per_action_all_steps": quantiles_ms(per_action),
        "actions": actions, "episodes": len(run["episodes"]), "wall_s": run["wall_s"],
        "actions_per_s": actions / run["wall_s"], "statuses": dict(statuses),
        "errors": sum(n for k, n in statuses.items() if k != "ok"),
    }  # fmt: skip


def mixed_tasks(n: int) -> list[Task]:
    """`n` train tasks, levels 1-4 in turn (the i-th of each level's list)."""
    per_level = {lv: make_env("web-crm-v1", levels=[lv]).tasks("train", n=n) for lv in LEVELS}
    return [per_level[LEVELS[i % len(LEVELS)]][i // len(LEVELS)] for i in range(n)]


def tokenizer() -> Any:
    """SmolLM2's tokenizer from the default model's safetensors export (made on first use)."""
    from transformers import AutoTokenizer

    from rldojo.policy.models import smollm2_dir

    return AutoTokenizer.from_pretrained(str(smollm2_dir()))


def observation_sizes(pages: list[str]) -> dict[str, Any]:
    """Characters and SmolLM2 tokens of each page the agent read: median and max."""
    tok = tokenizer()
    tokens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in pages]
    chars = [len(p) for p in pages]
    return {
        "pages": len(pages), "tokenizer": "smollm2-135m-instruct",
        "tokens": {"median": statistics.median(tokens), "max": max(tokens),
                   "mean": statistics.fmean(tokens)},
        "chars": {"median": statistics.median(chars), "max": max(chars)},
    }  # fmt: skip


def chromium_memory(pid: int) -> dict[str, float]:
    """RSS and PSS (MiB) of process `pid` and all its descendants, read from /proc."""
    todo, seen, rss, pss = [pid], set(), 0, 0
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                continue
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("Rss", "Pss"):
                    kib = int(value.split()[0])
                    rss, pss = (rss + kib, pss) if key == "Rss" else (rss, pss + kib)
        except (OSError, ValueError):
            continue
    return {"rss_mib": rss / 1024, "pss_mib": pss / 1024, "processes": len(seen)}


async def pool_costs(counts: tuple[int, ...]) -> dict[str, Any]:
    """A fresh pool's start-up (launch + first context + first observation) and
    Chromium's memory with 0 and `counts` contexts open, each showing the home page."""
    from rldojo.envs.crm.data import base_snapshot, connect
    from rldojo.envs.web_crm.browser import BrowserPool
    from rldojo.envs.web_crm.server import shared_server

    conn = connect()
    conn.deserialize(base_snapshot(0, "default"))
    server = shared_server()
    session = server.open_session(conn)
    pool = BrowserPool(max_contexts=max(counts))
    try:
        t0 = time.perf_counter()
        first = await pool.open(session.origin, cookies=[session.cookie])
        await first.observe()
        startup_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        second = await pool.open(session.origin, cookies=[session.cookie])
        await second.observe()
        warm_open_s = time.perf_counter() - t0
        await first.close()
        await second.close()
        await asyncio.sleep(1.0)  # closed renderers exit
        assert pool.browser_pid is not None
        memory = {0: chromium_memory(pool.browser_pid)}
        sessions = []
        for n in counts:
            while len(sessions) < n:
                sessions.append(await pool.open(session.origin, cookies=[session.cookie]))
                await sessions[-1].observe()
            memory[n] = chromium_memory(pool.browser_pid)
        for s in sessions:
            await s.close()
    finally:
        pool.close()
        server.close_session(session.token)
    base = memory[0]
    per_context = {n: {k: (memory[n][k] - base[k]) / n for k in ("rss_mib", "pss_mib")}
                   for n in counts}  # fmt: skip
    return {"startup_s": startup_s, "open_and_observe_warm_s": warm_open_s,
            "memory": memory, "per_context_mib": per_context}  # fmt: skip


def pass_rates(n: int, concurrency: int) -> dict[str, Any]:
    """The expert on `n` train tasks of each level, `concurrency` at once, level by level."""
    levels: dict[int, Any] = {}
    for level in LEVELS:
        tasks = make_env("web-crm-v1", levels=[level]).tasks("train", n=n)
        run = asyncio.run(play_all(tasks, concurrency))
        eps = run["episodes"]
        k = sum(e["passed"] for e in eps)
        templates: dict[str, list[int]] = {}
        for e in eps:
            templates.setdefault(e["template"], [0, 0])
            templates[e["template"]][0] += e["passed"]
            templates[e["template"]][1] += 1
        actions = [e["actions"] for e in eps]
        lo, hi = wilson_interval(k, len(eps))
        levels[level] = {
            "passed": k, "total": len(eps), "rate": k / len(eps), "wilson95": [lo, hi],
            "templates": {t: {"passed": p, "total": m} for t, (p, m) in templates.items()},
            "statuses": dict(Counter(e["status"] for e in eps)),
            "actions_per_episode": {"median": statistics.median(actions), "max": max(actions)},
            "timing": timing_summary(run),
        }  # fmt: skip
        print(f"level {level}: {k}/{len(eps)} passed, {run['wall_s']:.0f}s", flush=True)
    return levels


def default_label() -> str:
    """The CPU kind and cores, e.g. `avx512_bf16-2cores` (as `quickstart.py` labels)."""
    flags = results_io.machine()["cpu_flags"]
    kind = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags), "cpu")
    return f"{kind}-{os.cpu_count()}cores"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every part of the benchmark, in order: pool, timing, observations, pass rates."""
    pool = asyncio.run(pool_costs((1, 2) if args.dry else (1, 4, 8)))
    print(f"pool: start-up {pool['startup_s']:.2f}s; per context {pool['per_context_mib']}")
    tasks, timing, pages = mixed_tasks(args.timing_episodes), {}, []
    asyncio.run(play_all(tasks[:2], 2))  # warm: the shared pool, the server, imports
    for c in args.concurrency:
        run = asyncio.run(play_all(tasks, c))
        timing[str(c)] = timing_summary(run)
        if not pages:  # the first run's pages (every run shows the same ones)
            pages = [p for e in run["episodes"] for p in e["pages"]]
        t = timing[str(c)]
        print(f"{c} at once: action+observe {t['action_plus_observe']}, "
              f"{t['actions_per_s']:.1f} actions/s, statuses {t['statuses']}",
              flush=True)  # fmt: skip
    one = timing[str(min(args.concurrency))]["action_plus_observe"]["median_ms"]
    top = timing.get(str(TARGET_CONCURRENCY))
    targets = {
        "median_action_plus_observe_ms": {"target": TARGET_ACTION_MS, "measured": one,
                                          "met": one is not None and one <= TARGET_ACTION_MS},
        "concurrent_without_errors": {"target": TARGET_CONCURRENCY,
                                      "errors": None if top is None else top["errors"],
                                      "met": top is not None and top["errors"] == 0},
    }  # fmt: skip
    passing = pass_rates(args.tasks, args.pass_concurrency)
    return {"pool": pool, "timing": timing, "observation": observation_sizes(pages),
            "pass_rate": passing, "targets": targets}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="train tasks per level")
    parser.add_argument("--timing-episodes", type=int, default=16,
                        help="episodes timed per concurrency")  # fmt: skip
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--pass-concurrency", type=int, default=8,
                        help="episodes at once in the pass-rate runs")  # fmt: skip
    results_io.add_result_args(
        parser, "2 tasks per level, 4 timing episodes at 1 and 2 at once, 1-2 contexts"
    )
    args = parser.parse_args()
    if args.dry:
        args.tasks, args.timing_episodes, args.concurrency = 2, 4, [1, 2]
    load_before = load_average()
    result = {**measure(args), "load_average_before": load_before,
              "load_average_after": load_average(), "settings": vars(args) | {
                  "results": str(args.results) if args.results else None}}  # fmt: skip
    label = "dry" if args.dry else default_label()
    path = results_io.write_result("web_env", label, result, out_dir=args.results, dry=args.dry)
    for name, t in result["targets"].items():
        print(f"target {name}: {t}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
