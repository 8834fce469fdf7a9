"""OpenEnv's wire vs in process: crm-v1 and tictactoe-v1 episodes, turn by turn.

    python benchmarks/openenv_overhead.py [--episodes 20] [--rounds 3]
        [--envs crm-v1 tictactoe-v1] [--results DIR] [--dry]

Each environment's expert (`rldojo.envs.experts`) plays the same episodes (task i of
``train``, seed i) two ways:

* ``in_process``: rldojo's `ServedEpisode` driven directly on an event loop: a fresh
  environment per reset, each turn through `Env.step`, the grader at the end;
* ``served``: the same episodes through `rldojo env serve` (its own process, loopback)
  and OpenEnv's `GenericEnvClient`, one WebSocket session: the server runs the very same
  `ServedEpisode`, so the difference is the transport (JSON over a WebSocket, OpenEnv's
  server and client, a second process).

Every episode's actions and reward must be equal both ways (the script stops otherwise).
Per way it reports the median over rounds of: the mean time of a turn that does not end
the episode (a tool call in crm-v1, a move in tictactoe-v1; the expert's own time is
left out), the reset and the closing (graded) turn, and episodes per second; and the
ratio served / in process of the per-turn time. Target (issue): served <= 1.5x in
process per tool turn. The two ways alternate round by round, so load from other jobs
hits both alike; the JSON records the load average before and after.

Writes ``benchmarks/results/openenv_overhead/<cpu kind>-<N>cores.json`` (`results_io`);
``--dry``: 2 episodes of each environment, one round, crm-v1 on its small database, into
a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import results_io  # benchmarks/ is on sys.path
from machine_load import load_average

from rldojo.envs.experts import expert_for
from rldojo.interop.served_episode import ServedEnvSpec, ServedEpisode, TaskBook

TARGET_RATIO = 1.5
"""Served / in-process time per tool turn must not exceed this (the issue's target)."""
ENV_KWARGS: dict[str, dict[str, Any]] = {"crm-v1": {}, "tictactoe-v1": {}}
DRY_KWARGS: dict[str, dict[str, Any]] = {"crm-v1": {"db_size": "small", "n_databases": 1}}
START_TIMEOUT_S = 120.0

Reply = tuple[list[dict[str, Any]], bool, float | None]
"""What one reset or turn gives the player: new messages, done, reward."""


@dataclass
class Episode:
    """One played episode: its actions, reward and the time of each call (seconds)."""

    actions: list[str] = field(default_factory=list)
    reward: float | None = None
    reset_s: float = 0.0
    turn_s: list[float] = field(default_factory=list)


async def play(
    reset: Callable[[], Awaitable[Reply]], step: Callable[[str], Awaitable[Reply]],
    act: Callable[[list[dict[str, Any]]], str],
) -> Episode:  # fmt: skip
    """One episode: reset, then the expert's turns until done; only the env calls timed."""
    episode = Episode()
    t0 = time.perf_counter()
    messages, done, reward = await reset()
    episode.reset_s = time.perf_counter() - t0
    messages = list(messages)
    while not done:
        action = act(messages)
        messages.append({"role": "assistant", "content": action})
        t0 = time.perf_counter()
        reply, done, reward = await step(action)
        episode.turn_s.append(time.perf_counter() - t0)
        episode.actions.append(action)
        messages += reply
    episode.reward = reward
    return episode


async def in_process(spec: ServedEnvSpec, indices: list[int], act: Callable) -> list[Episode]:
    """The episodes on `ServedEpisode` in this process."""
    served = ServedEpisode(spec, TaskBook(spec))

    async def reset(i: int) -> Reply:
        r = await served.reset(index=i, seed=i)
        return r.messages, r.done, r.reward

    async def step(action: str) -> Reply:
        r = await served.step(action)
        return r.messages, r.done, r.reward

    episodes = []
    for i in indices:
        episodes.append(await play(lambda i=i: reset(i), step, lambda m, i=i: act(m, i)))
    await served.close()
    return episodes


async def over_openenv(url: str, indices: list[int], act: Callable) -> list[Episode]:
    """The episodes through OpenEnv's client, one WebSocket session."""
    from openenv.core import GenericEnvClient

    async with GenericEnvClient(base_url=url) as client:

        async def reset(i: int) -> Reply:
            r = await client.reset(index=i, seed=i)
            return r.observation["messages"], r.done, r.reward

        async def step(action: str) -> Reply:
            r = await client.step({"message": action})
            return r.observation["messages"], r.done, r.reward

        return [await play(lambda i=i: reset(i), step, lambda m, i=i: act(m, i)) for i in indices]


def start_servers(
    kwargs: dict[str, dict[str, Any]], where: str, stack: contextlib.ExitStack
) -> dict[str, str]:
    """A server per environment, closed with `stack`; their URLs. ``process``: `rldojo env
    serve` processes, launched together (importing OpenEnv's server takes seconds);
    ``thread``: `start_env_server` in this process (what `--dry` uses: no extra imports)."""
    if where == "thread":
        from rldojo.interop.openenv_server import start_env_server

        return {e: stack.enter_context(start_env_server(ServedEnvSpec(e, k))).url
                for e, k in kwargs.items()}  # fmt: skip
    processes = {}
    for env_id, env_kwargs in kwargs.items():
        processes[env_id] = subprocess.Popen(
            [sys.executable, "-m", "rldojo", "env", "serve", env_id, "--port", "0",
             "--kwargs", json.dumps(env_kwargs)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        stack.callback(_stop, processes[env_id])
    return {e: _listening_url(p, e) for e, p in processes.items()}


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=60)


def _listening_url(process: subprocess.Popen[str], env_id: str) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()  # bounded by the process: it prints or exits
    found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
    if not found:
        raise SystemExit(f"rldojo env serve {env_id} did not start: {line!r}")
    return found.group(1)


def summary(episodes: list[Episode]) -> dict[str, float]:
    """Mean times (ms) of one round's calls, and its episodes per second."""
    tool_turns = [t for e in episodes for t in e.turn_s[:-1]]
    total = sum(e.reset_s + sum(e.turn_s) for e in episodes)
    return {
        "turn_ms": 1000 * statistics.fmean(tool_turns) if tool_turns else float("nan"),
        "reset_ms": 1000 * statistics.fmean(e.reset_s for e in episodes),
        "closing_turn_ms": 1000 * statistics.fmean(e.turn_s[-1] for e in episodes),
        "episodes_per_s": len(episodes) / total,
        "tool_turns": len(tool_turns),
    }


def bench_env(
    env_id: str, kwargs: dict[str, Any], url: str, episodes: int, rounds: int
) -> dict[str, Any]:
    """Both ways, `rounds` times, alternating; every episode checked equal both ways."""
    spec = ServedEnvSpec(env_id, kwargs)
    tasks, expert = TaskBook(spec).tasks("train"), expert_for(env_id, **kwargs)

    def act(messages: list[dict[str, Any]], i: int) -> str:
        return expert.act(messages, tasks[i])

    indices = list(range(episodes))
    asyncio.run(in_process(spec, indices[:2], act))  # warm both: caches, imports
    asyncio.run(over_openenv(url, indices[:2], act))
    runs: dict[str, list[dict[str, float]]] = {"in_process": [], "served": []}
    rewards: list[float | None] = []
    for r in range(rounds):
        order = ["in_process", "served"] if r % 2 == 0 else ["served", "in_process"]
        played: dict[str, list[Episode]] = {}
        for way in order:
            coro = (
                in_process(spec, indices, act)
                if way == "in_process"
                else over_openenv(url, indices, act)
            )
            played[way] = asyncio.run(coro)
            runs[way].append(summary(played[way]))
        for a, b in zip(played["in_process"], played["served"], strict=True):
            if (a.actions, a.reward) != (b.actions, b.reward):
                raise SystemExit(f"{env_id}: an episode differs: {a} vs {b}")
        rewards = [e.reward for e in played["served"]]
    medians = {way: {k: statistics.median(s[k] for s in runs[way]) for k in runs[way][0]}
               for way in runs}  # fmt: skip
    ratio = medians["served"]["turn_ms"] / medians["in_process"]["turn_ms"]
    return {
        "kwargs": kwargs, "episodes": episodes, "rounds": rounds, "rewards": rewards,
        "median": medians, "per_round": runs, "ratio_turn_served_over_in_process": ratio,
        "ratio_episodes_per_s_in_process_over_served":
            medians["in_process"]["episodes_per_s"] / medians["served"]["episodes_per_s"],
        "meets_target": ratio <= TARGET_RATIO,
    }  # fmt: skip


def default_label() -> str:
    """The CPU kind and cores, e.g. `avx512_bf16-2cores` (as `quickstart.py` labels)."""
    flags = results_io.machine()["cpu_flags"]
    kind = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags), "cpu")
    return f"{kind}-{os.cpu_count()}cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20, help="episodes per way and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both ways")
    parser.add_argument("--envs", nargs="+", default=list(ENV_KWARGS), choices=list(ENV_KWARGS))
    parser.add_argument("--server", choices=["process", "thread"], default=None,
                        help="where the servers run (default: process; --dry: thread)")  # fmt: skip
    results_io.add_result_args(
        parser, "2 episodes per env, one round, crm-v1 small, servers in a thread"
    )
    args = parser.parse_args()
    if args.dry:
        args.episodes, args.rounds = 2, 1
    args.server = args.server or ("thread" if args.dry else "process")
    load_before = load_average()
    kwargs = {
        e: (DRY_KWARGS.get(e, ENV_KWARGS[e]) if args.dry else ENV_KWARGS[e]) for e in args.envs
    }
    with contextlib.ExitStack() as stack:
        urls = start_servers(kwargs, args.server, stack)
        envs = {e: bench_env(e, kwargs[e], urls[e], args.episodes, args.rounds) for e in urls}
    result = {
        "target_ratio": TARGET_RATIO, "server": args.server, "envs": envs,
        "load_average_before": load_before, "load_average_after": load_average(),
    }  # fmt: skip
    label = "dry" if args.dry else default_label()
    path = results_io.write_result(
        "openenv_overhead", label, result, out_dir=args.results, dry=args.dry
    )
    for env_id, r in envs.items():
        local, served = r["median"]["in_process"], r["median"]["served"]
        print(
            f"{env_id}: per turn {local['turn_ms']:.2f} ms in process, {served['turn_ms']:.2f} "
            f"ms served = {r['ratio_turn_served_over_in_process']:.2f}x (target <= "
            f"{TARGET_RATIO}x: {r['meets_target']}); episodes/s {local['episodes_per_s']:.1f} "
            f"vs {served['episodes_per_s']:.1f}; reset {local['reset_ms']:.1f} vs "
            f"{served['reset_ms']:.1f} ms"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
