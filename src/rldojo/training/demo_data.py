"""Demonstration files for supervised fine-tuning: read and checked (`read_demos`), then
replayed into rollouts with RL's tokens and policy mask (`tokenize_demos`), and the turn
budget they need (`turn_budget`).

A demonstration is one JSON line `{"messages": [...], "tools": [...] | null, "passed":
bool, "task_id": str, "env": str}` (`rldojo demos` writes them); every error names the
file, line and field before any model loads.

Messages come in either of two forms, mixed freely within a file or a conversation:
rldojo's, where an assistant turn's calls are ``<tool_call>`` text in its content, and
OpenAI's (`rldojo demos --format openai`, OpenAI's fine-tuning files, most datasets),
where they are `tool_calls` (content null or text) and each result is a ``tool`` message
with the `tool_call_id` of a call of the assistant turn before it. An OpenAI turn is
trained on as text written by `rldojo.inference.chat_tools.assistant_text`, the writer
`rldojo serve` uses for the same messages; a `tool_call_id` that matches no call and
arguments that are not a JSON object are errors.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig
from rldojo.data.loading import DataError, read_rows, require_field
from rldojo.inference.chat_tools import assistant_text
from rldojo.rollout.replay import conversation_rollout
from rldojo.types import Message, Rollout

__all__ = ["ROLES", "Demo", "DemoSet", "assistant_turn_tokens", "read_demos", "text_messages",
           "tokenize_demos", "turn_budget"]  # fmt: skip

ROLES = frozenset({"system", "user", "assistant", "tool"})

TOKENIZE_LINE_EVERY = 500
"""Tokenizing 500 ten-turn demonstrations takes about 6 s on a busy 2-core CPU."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demo:
    """One demonstration read from a file (`line` for error messages)."""

    line: int
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    task_id: str
    env: str


@dataclass
class DemoSet:
    """Demonstrations ready to train on, and what was left out (reason -> count)."""

    rollouts: list[Rollout]
    skipped: Counter[str] = field(default_factory=Counter)


def read_demos(path: str | os.PathLike[str], *, only_passed: bool = True) -> tuple[list[Demo], int]:
    """The file's demonstrations (checked before any model loads) and how many lines were
    left out as not passed. Raises `DataError` naming the file, line and field."""
    demos: list[Demo] = []
    not_passed = 0
    if not Path(path).exists():
        raise DataError(path, None, "file not found")
    for line, row in read_rows(path):
        messages = text_messages(require_field(row, "messages", path, line, (list,)), path, line)
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(path, line, "field 'messages': no assistant turn to learn from")
        if messages[0]["role"] == "assistant":
            raise DataError(path, line, "field 'messages': starts with an assistant turn")
        tools = row.get("tools")
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise DataError(path, line, "field 'tools': expected a list of objects or null")
        if only_passed and row.get("passed") is False:
            not_passed += 1
            continue
        task_id = str(row.get("task_id") or f"line-{line}")
        demos.append(Demo(line, messages, tools, task_id, str(row.get("env") or "demo")))
    return demos, not_passed


def text_messages(
    messages: Sequence[Any], path: str | os.PathLike[str], line: int
) -> list[Message]:
    """`messages` (rldojo's or OpenAI's form, see the module docstring) as the
    ``{role, content}`` text the model is trained on; `DataError` names the field."""
    out: list[Message] = []
    ids: set[str] = set()  # the calls of the last assistant turn
    for i, m in enumerate(messages):
        where = f"field 'messages[{i}]'"
        if not isinstance(m, dict):
            raise DataError(path, line, f"{where}: expected object")
        role = m.get("role")
        if role not in ROLES:
            raise DataError(path, line, f"{where}.role: expected one of {sorted(ROLES)}")
        if role == "assistant":
            content, ids = _assistant_text(m, where, path, line)
        else:
            content = _other_text(m, where, ids, path, line)
        out.append({"role": role, "content": content})
    return out


def _other_text(
    m: dict[str, Any], where: str, ids: set[str], path: str | os.PathLike[str], line: int
) -> str:
    """A system, user or tool message's content; a tool message's `tool_call_id`, if it
    has one, must name a call of the assistant turn before it (`ids`)."""
    if m.get("tool_calls") is not None:
        raise DataError(path, line, f"{where}.tool_calls: only assistant turns make calls")
    content = m.get("content")
    if not isinstance(content, str):
        raise DataError(path, line, f"{where}.content: expected str")
    call_id = m.get("tool_call_id")
    if m["role"] == "tool" and call_id is not None and call_id not in ids:
        raise DataError(
            path,
            line,
            f"{where}.tool_call_id: {call_id!r} matches no call of the assistant turn before it",
        )
    return content


def _assistant_text(
    m: dict[str, Any], where: str, path: str | os.PathLike[str], line: int
) -> tuple[str, set[str]]:
    """An assistant message's text, its calls written in (`assistant_text`), and the ids
    of its calls."""
    calls = m.get("tool_calls") or []
    content = m.get("content")
    if not isinstance(content, str) and not (content is None and calls):
        raise DataError(path, line, f"{where}.content: expected str")
    if not isinstance(calls, list):
        raise DataError(path, line, f"{where}.tool_calls: expected a list of calls")
    pairs, ids = [], set()
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DataError(path, line, f'{at}.function: expected {{"name", "arguments"}}')
        pairs.append((function["name"], _arguments(function.get("arguments"), at, path, line)))
        if isinstance(call.get("id"), str):
            ids.add(call["id"])
    return assistant_text(content, pairs), ids


def _arguments(arguments: Any, at: str, path: str | os.PathLike[str], line: int) -> dict[str, Any]:
    """A call's arguments: OpenAI's JSON string of an object (or the object itself)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise DataError(
                path,
                line,
                f"{at}.function.arguments: not valid JSON ({exc.msg}, column {exc.colno})",
            ) from None
    if not isinstance(arguments, dict):
        raise DataError(path, line, f"{at}.function.arguments: expected a JSON object")
    return arguments


def tokenize_demos(
    demos: Sequence[Demo],
    tokenizer: Any,
    *,
    max_seq_len: int,
    path: str = "demos",
) -> DemoSet:
    """Each demonstration as the engine's `Rollout` (see the module docstring); longer
    than `max_seq_len` tokens is left out and counted (`too_long`). Logged (INFO): the
    start, then each `TOKENIZE_LINE_EVERY` done (the run loop shows the lines)."""
    log.info("sft: tokenizing %d demonstrations from %s", len(demos), path)
    out = DemoSet([])
    for done, demo in enumerate(demos):
        if done and done % TOKENIZE_LINE_EVERY == 0:
            log.info("sft: tokenized %d/%d demonstrations", done, len(demos))
        try:
            rollout = conversation_rollout(
                tokenizer, demo.messages, demo.tools, task_id=demo.task_id, env=demo.env
            )
        except ValueError as exc:
            raise DataError(path, demo.line, f"field 'messages': {exc}") from None
        if len(rollout.prompt_ids) + len(rollout.completion_ids) > max_seq_len:
            out.skipped["too_long"] += 1
            continue
        out.rollouts.append(rollout)
    return out


def assistant_turn_tokens(rollout: Rollout) -> list[int]:
    """Tokens in each assistant turn (each run of `policy_mask` ones: the content and its
    end-of-turn token): what a sampler has to generate, within `max_new_tokens`, to
    reproduce that turn."""
    runs: list[int] = []
    previous = False
    for trained in rollout.policy_mask:
        if trained and not previous:
            runs.append(0)
        if trained:
            runs[-1] += 1
        previous = bool(trained)
    return runs


def turn_budget(cfg: TrainConfig, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The longest assistant turn of the demonstrations, and how many demonstrations have
    a turn longer than the config's generation budgets. RL and the evaluations sample
    with those budgets: a turn that does not fit is cut there, so a policy cannot
    reproduce it (and a shorter, wrong turn can out-earn the cut right one)."""
    longest = [max(assistant_turn_tokens(r)) for r in rollouts]
    limits = {
        "sampling.max_new_tokens": cfg.sampling.max_new_tokens,
        "eval.max_new_tokens": cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens,
    }
    return {
        "longest_turn_tokens": max(longest),
        "demos_over": {key: sum(n > limit for n in longest) for key, limit in limits.items()},
        "limits": limits,
    }
