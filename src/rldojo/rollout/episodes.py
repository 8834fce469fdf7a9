"""Rollouts: run episodes of the policy in environments, then grade them.

`collect_rollouts` runs many episodes turn by turn: every live episode's conversation is
encoded, the policy samples one turn for all of them in one batched call, and each
environment answers its turn. Environment and policy failures become rollout statuses
(`env_error`, `timeout`, `policy_error`); they never raise out of here. `grade_rollouts`
scores finished rollouts concurrently with a per-rollout timeout; a grader that raises or
hangs yields `Score.failed(...)`, never a reward of 0.

Token bookkeeping: `prompt_ids` is the encoded opening conversation; `completion_ids`
holds every later token, with `policy_mask` True where the policy wrote it. Sampled ids
are kept as sampled; an environment turn adds the tokens of the text the chat template
puts after the assistant's content (see `_env_turn_ids`), so the trainer sees exactly the
tokens the policy conditioned on.

Progress (`collect_rollouts(progress=...)`, what an evaluation shows while it runs): per
turn, how many of the turn's episodes have their answer sampled. A policy whose
`generate` takes `on_step` (the transformers backend) reports each answer as it ends;
any other, the turn's start and end.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import TypeIs

from rldojo.envs.base import Env, EnvFactory
from rldojo.graders.base import Grader, self_timed
from rldojo.policy.base import Policy, streams_steps
from rldojo.types import Completion, Message, Rollout, RolloutStatus, SamplingParams, Score, Task

if TYPE_CHECKING:
    from rldojo.policy.sampling import DecodeStep

T = TypeVar("T")

Tools = list[dict[str, Any]]
"""An episode's tool schemas (OpenAI format), from its environment's `reset` info."""

TurnProgress = Callable[[int, int, int], None]
"""`(turn, done, total)`: of the `total` episodes playing turn `turn` (1, 2, ...), `done`
have their answer sampled (see the module docstring)."""


@dataclass
class _Episode:
    task: Task
    sample_index: int
    seed: int
    env: Env | None = None
    messages: list[Message] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    last_text: str = ""
    status: RolloutStatus = "ok"
    error: str = ""
    done: bool = False
    turns: int = 0
    version: int = -1
    tools: Tools | None = None
    info: dict[str, Any] = field(default_factory=dict)


async def bounded(coro: Awaitable[T], timeout_s: float, what: str) -> T:
    """`coro`'s result; past `timeout_s`, TimeoutError("{what} took longer than ...").
    A TimeoutError the call raises itself (web-crm-v1's browser that stopped answering)
    keeps its own message."""
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await coro
    except TimeoutError:
        if not deadline.expired():
            raise
        raise TimeoutError(f"{what} took longer than {timeout_s:g}s") from None


async def _with_timeout(
    coro: Awaitable[T], timeout_s: float, what: str, env: Env | None = None
) -> T:
    if self_timed(env):  # e.g. a RemoteEnv: bounded calls already
        return await coro
    return await bounded(coro, timeout_s, what)


def _takes_task(make_env: EnvFactory) -> TypeIs[Callable[[Task], Env]]:
    """Whether a factory takes the task: one with a positional parameter does, one without
    (a lambda, or `functools.partial(make_env, id)` with only **kwargs) is called bare."""
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    params = inspect.signature(make_env).parameters.values()
    return any(p.kind in positional for p in params)


def _per_task(make_env: EnvFactory) -> Callable[[Task], Env]:
    """The factory as one that takes the task (`_takes_task`)."""
    if _takes_task(make_env):
        return make_env
    bare = make_env
    return lambda _task: bare()


def _encode(policy: Policy, messages: list[Message], tools: Tools | None) -> list[int]:
    """Encode a conversation, passing tool schemas to policies whose `encode_chat` takes them."""
    if tools and "tools" in inspect.signature(policy.encode_chat).parameters:
        return policy.encode_chat(messages, tools)
    return policy.encode_chat(messages)


async def _reset(
    ep: _Episode, make_env: Callable[[Task], Env], policy: Policy, timeout_s: float
) -> None:
    try:
        ep.env = make_env(ep.task)
        obs = await _with_timeout(
            ep.env.reset(ep.task, seed=ep.seed), timeout_s, "env.reset", ep.env
        )
        ep.messages = list(obs.messages)
        ep.tools = obs.info.get("tools") or None
        ep.prompt_ids = _encode(policy, ep.messages, ep.tools)
    except Exception as exc:  # an environment failure is a status, not a crash
        _fail(ep, "timeout" if isinstance(exc, TimeoutError) else "env_error", exc)


def _fail(ep: _Episode, status: RolloutStatus, exc: BaseException) -> None:
    ep.status, ep.error, ep.done = status, f"{type(exc).__name__}: {exc}", True


def _add_policy_turn(ep: _Episode, completion: Completion) -> None:
    ep.ids += completion.token_ids
    ep.mask += [True] * len(completion.token_ids)
    ep.logprobs += completion.logprobs
    ents = completion.entropies or (0.0,) * len(completion.token_ids)
    ep.entropies += ents
    ep.last_text = completion.text
    ep.messages.append({"role": "assistant", "content": completion.text})
    ep.turns += 1
    if completion.finish_reason == "length":
        ep.info["truncated_turns"] = ep.info.get("truncated_turns", 0) + 1


async def _env_turn(
    ep: _Episode, policy: Policy, timeout_s: float, max_turns: int, max_tokens: int | None
) -> None:
    assert ep.env is not None
    try:
        result = await _with_timeout(ep.env.step(ep.last_text), timeout_s, "env.step", ep.env)
    except Exception as exc:
        _fail(ep, "timeout" if isinstance(exc, TimeoutError) else "env_error", exc)
        return
    for key, value in result.info.items():
        ep.info[key] = value
    over_budget = max_tokens is not None and len(ep.ids) >= max_tokens
    if result.done or ep.turns >= max_turns or over_budget:
        ep.done = True
        if not result.done:
            ep.status = "truncated"
            ep.info["episode/cut"] = "tokens" if over_budget else "turns"
        return
    ep.messages.extend(result.messages)
    env_ids = _env_turn_ids(policy, ep, len(result.messages))
    ep.ids += env_ids
    ep.mask += [False] * len(env_ids)
    ep.logprobs += [0.0] * len(env_ids)
    ep.entropies += [0.0] * len(env_ids)


def _env_turn_ids(policy: Policy, ep: _Episode, n_new: int) -> list[int]:
    """Tokens that follow the policy's sampled ids: the end of its turn as the chat template
    closes it, the environment's messages, and the next assistant opening.

    The sampled ids are kept as sampled (they are what the policy conditioned on and what
    is trained); only the text the template adds after the assistant's content is
    tokenised, on its own. Re-encoding the whole conversation and slicing at the sampled
    length would shift whenever the sampled ids are not the canonical tokenisation of
    their text (a stop string cut the text, or BPE merges differently).
    """
    tokenizer = policy.tokenizer
    if tokenizer is None:  # ids of no tokenizer's: slice the re-encoding
        return _reencoded(policy, ep)
    kwargs: dict[str, Any] = {"tools": list(ep.tools)} if ep.tools else {}
    texts = [
        tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kwargs)
        for msgs, gen in (
            (ep.messages[: -n_new - 1], True),
            (ep.messages[:-n_new], False),
            (ep.messages, True),
        )
    ]
    content = str(ep.messages[-n_new - 1].get("content") or "")
    if not (texts[2].startswith(texts[1]) and texts[1].startswith(texts[0] + content)):
        return _reencoded(policy, ep)  # a template not prefix-stable, or rewriting the content
    closing = texts[1][len(texts[0]) + len(content) :]  # "<|im_end|>\n" in ChatML
    ids = list(tokenizer(closing, add_special_tokens=False)["input_ids"]) if closing else []
    last = ep.ids[-1] if ep.ids else None
    if ids and ids[0] == last:  # the policy sampled the end-of-turn token itself
        ids = ids[1:]
    return ids + list(tokenizer(texts[2][len(texts[1]) :], add_special_tokens=False)["input_ids"])


def _reencoded(policy: Policy, ep: _Episode) -> list[int]:
    """The ids after those the episode holds, from re-encoding its whole conversation."""
    seen = len(ep.prompt_ids) + len(ep.ids)
    return _encode(policy, ep.messages, ep.tools)[seen:]


async def collect_rollouts(
    make_env: EnvFactory,
    policy: Policy,
    tasks: Sequence[tuple[Task, int, int]],
    sampling: SamplingParams,
    *,
    env_timeout_s: float = 30.0,
    max_turns: int = 8,
    max_episode_tokens: int | None = None,
    progress: TurnProgress | None = None,
) -> list[Rollout]:
    """Run one episode per `(task, sample_index, seed)` and return their rollouts, in order;
    `progress` hears how far each turn's generation got."""
    episodes = [_Episode(task, index, seed) for task, index, seed in tasks]
    factory = _per_task(make_env)
    await asyncio.gather(*(_reset(ep, factory, policy, env_timeout_s) for ep in episodes))
    turn = 0
    while live := [ep for ep in episodes if not ep.done]:
        prompts = [ep.prompt_ids + ep.ids for ep in live]
        params = replace(sampling, seed=None if sampling.seed is None else sampling.seed + turn)
        report = None if progress is None else partial(progress, turn + 1)
        try:
            completions = _generate(policy, prompts, params, report)
        except Exception as exc:  # a backend failure ends these episodes, it does not crash
            for ep in live:
                _fail(ep, "policy_error", exc)
            break
        for ep, completion in zip(live, completions, strict=True):
            _add_policy_turn(ep, completion)
            if ep.version < 0:  # the policy version that started this episode
                ep.version = policy.version
        await asyncio.gather(
            *(_env_turn(ep, policy, env_timeout_s, max_turns, max_episode_tokens) for ep in live)
        )
        turn += 1
    await asyncio.gather(*(_close(ep) for ep in episodes))
    return [_to_rollout(ep, ep.version if ep.version >= 0 else policy.version) for ep in episodes]


def _generate(
    policy: Policy,
    prompts: list[list[int]],
    params: SamplingParams,
    report: Callable[[int, int], None] | None,
) -> list[Completion]:
    """`policy.generate`, reporting `(done, total)` answers: at the start, as each ends
    (a policy whose `generate` takes `on_step`), and at the end."""
    if report is None:
        return policy.generate(prompts, params)
    total, done = len(prompts), 0
    report(0, total)

    def on_step(step: DecodeStep) -> None:
        nonlocal done
        ended = sum(reason is not None for reason in step.finished)
        if ended:
            done += ended
            report(done, total)

    if streams_steps(policy):
        completions = policy.generate(prompts, params, on_step=on_step)
    else:
        completions = policy.generate(prompts, params)
    if done < total:
        report(total, total)
    return completions


async def _close(ep: _Episode) -> None:
    if ep.env is not None:
        try:
            await asyncio.wait_for(ep.env.close(), 5.0)
        except Exception as exc:
            ep.info["close_error"] = repr(exc)


def _to_rollout(ep: _Episode, version: int) -> Rollout:
    return Rollout(
        task_id=ep.task.id,
        env=ep.task.env,
        messages=ep.messages,
        completion=ep.last_text,
        prompt_ids=tuple(ep.prompt_ids),
        completion_ids=tuple(ep.ids),
        policy_mask=tuple(ep.mask),
        logprobs=tuple(ep.logprobs),
        entropies=tuple(ep.entropies),
        policy_version=version,
        status=ep.status,
        sample_index=ep.sample_index,
        seed=ep.seed,
        error=ep.error,
        info=ep.info,
    )


async def _grade_one(
    grader: Grader, rollout: Rollout, task: Task, timeout_s: float, gate: asyncio.Semaphore
) -> Score:
    if rollout.status not in ("ok", "truncated"):
        return Score.failed("error", f"rollout failed ({rollout.status}): {rollout.error}")
    async with gate:
        try:
            if self_timed(grader):  # e.g. graders in env workers
                return await grader.grade(rollout, task)
            return await asyncio.wait_for(grader.grade(rollout, task), timeout_s)
        except TimeoutError:
            return Score.failed("timeout", f"{grader.name} took longer than {timeout_s:.0f}s")
        except Exception as exc:
            return Score.failed("error", f"{grader.name} raised {type(exc).__name__}: {exc}")


async def grade_rollouts(
    grader: Grader,
    rollouts: Sequence[Rollout],
    tasks: Sequence[Task],
    *,
    timeout_s: float = 30.0,
    concurrency: int = 8,
) -> list[Score]:
    """Grade each rollout against its task; failures are statuses, in order."""
    gate = asyncio.Semaphore(concurrency)
    return list(
        await asyncio.gather(
            *(
                _grade_one(grader, r, t, timeout_s, gate)
                for r, t in zip(rollouts, tasks, strict=True)
            )
        )
    )
