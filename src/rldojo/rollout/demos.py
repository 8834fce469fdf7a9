"""Demonstrations: whole episodes played by an expert or a teacher model, graded, as JSONL.

`play_episode` is the text-level episode loop: the actor writes each assistant turn, the
environment answers, until the env says done or `max_turns`. It builds the `Rollout`
the way `rldojo.rollout.episodes` does (step infos merged key by key; the env's messages
of the final step are not appended) and grades it with the env's own grader through
`grade_rollouts`. Environment failures and hangs are statuses (`env_error`, `timeout`),
an actor that raises is `policy_error`; nothing raises out of here.

An *actor* is any callable ``(messages, task) -> str`` (or an awaitable of it): an
`rldojo.envs.experts.Expert`'s `act`, or a `Teacher`, which asks an OpenAI-compatible
endpoint. `collect_demos` plays the tasks of a split with rejection sampling: up to
`samples` attempts per task, stopping at the first that passes, and keeps the passing
episodes (``keep="passed"``, at most one per task) or every attempt (``keep="all"``).

One demo record (one JSON line; the SFT data reader depends on these keys):

    {"env", "task_id", "seed", "messages": [{"role", "content"}...], "tools": [...] | null,
     "score", "passed", "status", "components", "turns", "source": "expert" | "teacher:M"}

`messages` are the env's opening, then each assistant turn followed by the env's reply,
ending with the final assistant turn. `status` is the rollout's status when it failed
(`env_error`, `timeout`, `policy_error`, `truncated`), else ``grade_<status>`` when the
grader failed, else ``ok``.

`rldojo.rollout.openai_demos` writes these records in OpenAI's tool-calling shape.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rldojo.envs.base import Env
from rldojo.graders.base import Grader, passed
from rldojo.graders.judges.client import JudgeRequest, OpenAIJudge
from rldojo.rollout.episodes import bounded, grade_rollouts
from rldojo.types import Message, Rollout, RolloutStatus, Score, Task

__all__ = [
    "Actor",
    "DemoStats",
    "Episode",
    "Teacher",
    "collect_demos",
    "demo_record",
    "passed",
    "play_episode",
]

Actor = Callable[[list[Message], Task], "str | Awaitable[str]"]
"""Writes the next assistant turn from the conversation so far and the task."""


@dataclass(frozen=True)
class Episode:
    """One played and graded episode: the rollout, its score, the tool schemas, turns."""

    rollout: Rollout
    score: Score
    tools: list[dict[str, Any]] | None = None
    turns: int = 0


async def _act(actor: Actor, messages: list[Message], task: Task) -> str:
    text = actor([dict(m) for m in messages], task)
    if inspect.isawaitable(text):
        text = await text
    if not isinstance(text, str):
        raise TypeError(f"the actor returned {type(text).__name__}, not str")
    return text


async def play_episode(
    env: Env,
    actor: Actor,
    task: Task,
    seed: int,
    *,
    max_turns: int = 32,
    timeout_s: float = 30.0,
    grader: Grader | None = None,
    sample_index: int = 0,
) -> Episode:
    """Play one episode of `actor` in `env` and grade it (`grader` or the env's own).

    `timeout_s` bounds each env call (reset, step) and the grade; the env is not closed.
    """
    messages: list[Message] = []
    info: dict[str, Any] = {}
    status: RolloutStatus = "ok"
    error, last, turns, tools = "", "", 0, None
    try:
        obs = await bounded(env.reset(task, seed=seed), timeout_s, "env.reset")
        messages, tools = [dict(m) for m in obs.messages], obs.info.get("tools") or None
        while True:
            try:
                last = await _act(actor, messages, task)
            except Exception as exc:  # a teacher endpoint that fails is the actor's failure
                status, error = "policy_error", f"{type(exc).__name__}: {exc}"
                break
            messages.append({"role": "assistant", "content": last})
            turns += 1
            result = await bounded(env.step(last), timeout_s, "env.step")
            for key, value in result.info.items():
                info[key] = value
            if result.done or turns >= max_turns:
                if not result.done:
                    status, info["episode/cut"] = "truncated", "turns"
                break
            messages.extend(dict(m) for m in result.messages)
    except Exception as exc:  # an environment failure is a status, not a crash
        status = "timeout" if isinstance(exc, TimeoutError) else "env_error"
        error = f"{type(exc).__name__}: {exc}"
    rollout = Rollout(
        task_id=task.id,
        env=task.env or getattr(env, "env_id", ""),
        messages=messages,
        completion=last,
        status=status,
        sample_index=sample_index,
        seed=seed,
        error=error,
        info=info,
    )
    grader = grader or env.default_grader()
    (score,) = await grade_rollouts(grader, [rollout], [task], timeout_s=timeout_s)
    return Episode(rollout, score, list(tools) if tools else None, turns)


def episode_status(episode: Episode) -> str:
    """The rollout's status when it failed, else ``grade_<status>`` or ``ok``."""
    if episode.rollout.status != "ok":
        return episode.rollout.status
    return "ok" if episode.score.ok else f"grade_{episode.score.status}"


def _passes(episode: Episode, threshold: float | None) -> bool:
    return episode.rollout.status == "ok" and passed(
        episode.score, 1.0 if threshold is None else threshold
    )


def demo_record(
    episode: Episode, env_id: str, source: str, *, pass_threshold: float | None = None
) -> dict[str, Any]:
    """The JSON record of an episode (see the module docstring)."""
    r = episode.rollout
    return {
        "env": env_id,
        "task_id": r.task_id,
        "seed": r.seed,
        "messages": [{"role": m["role"], "content": m["content"]} for m in r.messages],
        "tools": episode.tools,
        "score": episode.score.value,
        "passed": _passes(episode, pass_threshold),
        "status": episode_status(episode),
        "components": dict(episode.score.components),
        "turns": episode.turns,
        "source": source,
    }


@dataclass
class DemoStats:
    """What a collection played and kept."""

    tasks: int = 0
    episodes: int = 0
    passed: int = 0
    kept: int = 0
    tasks_passed: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    scores: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)

    def add(self, episode: Episode, ok: bool) -> None:
        """Count one played episode (`ok`: it passed)."""
        self.episodes += 1
        self.passed += ok
        self.statuses[episode_status(episode)] += 1
        if episode.score.ok and episode.score.value is not None:
            self.scores.append(float(episode.score.value))
        self.turns.append(episode.turns)
        self.tool_calls.append(int(episode.rollout.info.get("tool/calls", 0) or 0))

    def as_dict(self) -> dict[str, Any]:
        """Counts and means, JSON-ready (means are None when nothing was counted)."""

        def mean(xs: Sequence[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        return {
            "tasks": self.tasks,
            "episodes": self.episodes,
            "passed": self.passed,
            "tasks_passed": self.tasks_passed,
            "kept": self.kept,
            "mean_score": mean(self.scores),
            "statuses": dict(self.statuses),
            "mean_turns": mean(self.turns),
            "mean_tool_calls": mean(self.tool_calls),
        }


class Teacher:
    """An actor that asks an OpenAI-compatible chat endpoint for each assistant turn.

    The conversation goes as it is (``tool`` messages included, no ``tools=``): the env's
    system prompt teaches the text protocol of tool calls. Calls go through the judges'
    endpoint client (`rldojo.graders.judges.client.OpenAIJudge`: retries with backoff on
    transport errors, a concurrency limit), unseeded, so that the attempts of rejection
    sampling differ. `source` names the model in demo records (``teacher:<model>``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        temperature: float = 0.7,
        max_tokens: int = 256,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        concurrency: int = 8,
    ) -> None:
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        self.source = f"teacher:{model}"
        self._endpoint = OpenAIJudge(
            base_url,
            model,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            concurrency=concurrency,
        )

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> Teacher:
        """A teacher from ``http://host:port/v1#model-name`` (as `rldojo eval --model`)."""
        base_url, _, model = spec.partition("#")
        if not base_url.startswith(("http://", "https://")) or not model:
            raise ValueError(f"teacher {spec!r}: expected http://host:port/v1#model-name")
        return cls(base_url, model, **kwargs)

    async def __call__(self, messages: list[Message], task: Task) -> str:
        """The endpoint's reply to the conversation."""
        request = JudgeRequest(
            list(messages), temperature=self.temperature, max_tokens=self.max_tokens, seed=None
        )
        return await self._endpoint.complete(request)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._endpoint.aclose()


async def collect_demos(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    n: int,
    split: str = "train",
    seed: int = 0,
    actor: Literal["expert"] | Actor = "expert",
    expert: str | None = None,
    samples: int = 1,
    keep: Literal["passed", "all"] = "passed",
    pass_threshold: float | None = None,
    max_turns: int = 32,
    timeout_s: float = 30.0,
    concurrency: int = 8,
) -> tuple[list[dict[str, Any]], DemoStats]:
    """Play the first `n` tasks of `split` and return the demo records kept, and stats.

    `actor` is ``"expert"`` (`rldojo.envs.experts.expert_for`; `expert` names another
    expert than the env's own, by id or ``"pkg.mod:factory"``) or any actor (e.g. a
    `Teacher`, whose `source` names it). Rejection sampling: each task gets up to
    `samples` attempts (episode seed ``seed + i + k * n`` for task ``i``, attempt ``k``)
    and stops at the first that passes, so ``keep="passed"`` keeps at most one episode
    per task; ``keep="all"`` also keeps the failed attempts. Each episode runs in a fresh
    env; at most `concurrency` tasks play at once. Unknown envs, bad kwargs and envs
    without an expert raise before any episode (`UnknownEnvError`, `EnvKwargsError`,
    `ValueError`).
    """
    from rldojo.envs.experts import expert_for
    from rldojo.envs.registry import make_env

    if samples < 1 or n < 0 or keep not in ("passed", "all"):
        raise ValueError("need samples >= 1, n >= 0 and keep 'passed' or 'all'")
    kwargs = dict(env_kwargs or {})
    probe = make_env(env_id, **kwargs)
    tasks = list(probe.tasks(split, seed=seed, n=n))[:n]
    grader = probe.default_grader()
    await probe.close()
    if actor == "expert":
        play, source = expert_for(env_id, expert=expert, **kwargs).act, "expert"
    else:
        play, source = actor, str(getattr(actor, "source", "actor"))  # type: ignore[assignment]
    stats, gate = DemoStats(tasks=len(tasks)), asyncio.Semaphore(max(1, concurrency))

    async def attempts(i: int, task: Task) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        async with gate:
            for k in range(samples):
                env = make_env(env_id, **kwargs)
                try:
                    ep = await play_episode(
                        env,
                        play,
                        task,
                        seed + i + k * len(tasks),
                        max_turns=max_turns,
                        timeout_s=timeout_s,
                        grader=grader,
                        sample_index=k,
                    )
                finally:
                    await _close(env)
                ok = _passes(ep, pass_threshold)
                stats.add(ep, ok)
                if ok or keep == "all":
                    kept.append(demo_record(ep, env_id, source, pass_threshold=pass_threshold))
                if ok:
                    stats.tasks_passed += 1
                    break
        return kept

    per_task = await asyncio.gather(*(attempts(i, t) for i, t in enumerate(tasks)))
    records = [r for rows in per_task for r in rows]
    stats.kept = len(records)
    return records, stats


async def _close(env: Env) -> None:
    try:
        await asyncio.wait_for(env.close(), 5.0)
    except Exception:  # closing is best effort; the episode is already recorded
        pass
