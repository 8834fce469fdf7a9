"""One episode's mechanics, whichever engine plays it: its state (`Episode`), its reset,
the policy's turn added to it, the environment's turn, its close, and the `Rollout` it
becomes. Environment failures become statuses (`env_error`, `timeout`); they never raise
out of here.

Token bookkeeping: `prompt_ids` is the encoded opening conversation; `ids` holds every
later token, with `mask` True where the policy wrote it. Sampled ids are kept as sampled;
an environment turn adds the tokens of the text the chat template puts after the
assistant's content (see `env_turn_ids`), so the trainer sees exactly the tokens the
policy conditioned on.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from typing_extensions import TypeIs

from rldojo.envs.base import Env, EnvFactory
from rldojo.graders.base import self_timed
from rldojo.policy.base import Policy
from rldojo.types import Completion, Message, Rollout, RolloutStatus, Task

T = TypeVar("T")

Tools = list[dict[str, Any]]
"""An episode's tool schemas (OpenAI format), from its environment's `reset` info."""


@dataclass
class Episode:
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


async def with_timeout(
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


def per_task(make_env: EnvFactory) -> Callable[[Task], Env]:
    """The factory as one that takes the task (`_takes_task`)."""
    if _takes_task(make_env):
        return make_env
    bare = make_env
    return lambda _task: bare()


def encode(policy: Policy, messages: list[Message], tools: Tools | None) -> list[int]:
    """Encode a conversation, passing tool schemas to policies whose `encode_chat` takes them."""
    if tools and "tools" in inspect.signature(policy.encode_chat).parameters:
        return policy.encode_chat(messages, tools)
    return policy.encode_chat(messages)


async def reset(
    ep: Episode, make_env: Callable[[Task], Env], policy: Policy, timeout_s: float
) -> None:
    """Open the episode: its environment (made now unless it already is), the first
    observation, and the prompt's token ids."""
    try:
        if ep.env is None:
            ep.env = make_env(ep.task)
        obs = await with_timeout(
            ep.env.reset(ep.task, seed=ep.seed), timeout_s, "env.reset", ep.env
        )
        ep.messages = list(obs.messages)
        ep.tools = obs.info.get("tools") or None
        ep.prompt_ids = encode(policy, ep.messages, ep.tools)
    except Exception as exc:  # an environment failure is a status, not a crash
        fail(ep, "timeout" if isinstance(exc, TimeoutError) else "env_error", exc)


def fail(ep: Episode, status: RolloutStatus, exc: BaseException) -> None:
    ep.status, ep.error, ep.done = status, f"{type(exc).__name__}: {exc}", True


def add_policy_turn(ep: Episode, completion: Completion) -> None:
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


async def env_turn(
    ep: Episode, policy: Policy, timeout_s: float, max_turns: int, max_tokens: int | None
) -> None:
    assert ep.env is not None
    try:
        result = await with_timeout(ep.env.step(ep.last_text), timeout_s, "env.step", ep.env)
    except Exception as exc:
        fail(ep, "timeout" if isinstance(exc, TimeoutError) else "env_error", exc)
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
    env_ids = env_turn_ids(policy, ep, len(result.messages))
    ep.ids += env_ids
    ep.mask += [False] * len(env_ids)
    ep.logprobs += [0.0] * len(env_ids)
    ep.entropies += [0.0] * len(env_ids)


def env_turn_ids(policy: Policy, ep: Episode, n_new: int) -> list[int]:
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


def _reencoded(policy: Policy, ep: Episode) -> list[int]:
    """The ids after those the episode holds, from re-encoding its whole conversation."""
    seen = len(ep.prompt_ids) + len(ep.ids)
    return encode(policy, ep.messages, ep.tools)[seen:]


async def close_episode(ep: Episode) -> None:
    if ep.env is not None:
        try:
            await asyncio.wait_for(ep.env.close(), 5.0)
        except Exception as exc:
            ep.info["close_error"] = repr(exc)


def to_rollout(ep: Episode, version: int) -> Rollout:
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
