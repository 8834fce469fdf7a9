"""Demonstration files for supervised fine-tuning: read and checked (`read_demos`), then
replayed into rollouts with RL's tokens and policy mask (`tokenize_demos`), and the turn
budget they need (`turn_budget`).

A demonstration is one JSON line `{"messages": [...], "tools": [...] | null, "passed":
bool, "task_id": str, "env": str}` (`rldojo demos` writes them); every error names the
file, line and field before any model loads.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig
from rldojo.data.loading import DataError, read_rows, require_field
from rldojo.rollout.replay import conversation_rollout
from rldojo.types import Message, Rollout

__all__ = ["ROLES", "Demo", "DemoSet", "assistant_turn_tokens", "read_demos",
           "tokenize_demos", "turn_budget"]  # fmt: skip

ROLES = frozenset({"system", "user", "assistant", "tool"})


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
        messages = require_field(row, "messages", path, line, (list,))
        for i, m in enumerate(messages):
            where = f"field 'messages[{i}]'"
            if not isinstance(m, dict):
                raise DataError(path, line, f"{where}: expected object")
            if m.get("role") not in ROLES:
                raise DataError(path, line, f"{where}.role: expected one of {sorted(ROLES)}")
            if not isinstance(m.get("content"), str):
                raise DataError(path, line, f"{where}.content: expected str")
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
        clean = [{"role": m["role"], "content": m["content"]} for m in messages]
        task_id = str(row.get("task_id") or f"line-{line}")
        demos.append(Demo(line, clean, tools, task_id, str(row.get("env") or "demo")))  # type: ignore[arg-type]
    return demos, not_passed


def tokenize_demos(
    demos: Sequence[Demo], tokenizer: Any, *, max_seq_len: int, path: str = "demos"
) -> DemoSet:
    """Each demonstration as the engine's `Rollout` (see the module docstring); longer
    than `max_seq_len` tokens is left out and counted (`too_long`)."""
    out = DemoSet([])
    for demo in demos:
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
