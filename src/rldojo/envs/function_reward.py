"""A reward function and a list of rows as an environment: the TRL-style shortcut.

    def correct(prompt, completion, answer):
        return float(completion.strip() == answer)

    rows = [{"prompt": "2 + 2 =", "answer": "4"}, {"prompt": "3 + 5 =", "answer": "8"}]
    rldojo.train({"model": {"name": "tiny-random"}}, tasks=rows, reward=correct)

Each row is one task: `prompt` (a string, or a list of chat messages `{"role", "content"}`),
an optional `id`, and any other fields. `FunctionRewardEnv` poses the rows (one prompt,
one answer: a `SingleTurnEnv`); `FunctionGrader` calls the function, sync or async, as
`reward(prompt, completion, **fields)`: the prompt as the row gave it, the completion's
text and the row's other fields, those the function's signature accepts (all of them when
it takes `**kwargs`). An exception, or a value that is not a finite number, is a failed
grade (`status="error"`, the exception's line as the explanation), never a reward of 0.

A sync function runs on the rollout engine's event loop, so `rollout.grade_timeout_s`
cannot cut it short; a function that waits on I/O should be `async def`.

`rows_to_tasks` checks every row before any work (one line naming the row and the field);
`register_function_env` registers the environment in this process under an id derived
from the function and the rows, so a resumed run with the same ones finds the same id.
The function lives in this process: env worker processes and Ray workers cannot call it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from rldojo.data.loading import DataError
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.types import Message, Rollout, Score, Task

__all__ = [
    "FunctionGrader",
    "FunctionRewardEnv",
    "RewardFunction",
    "function_env_id",
    "register_function_env",
    "rows_to_tasks",
]

RewardFunction = Callable[..., float | Awaitable[float]]
"""`reward(prompt, completion, **fields) -> float`, or an `async def` returning one."""

ROLES = ("system", "user", "assistant", "tool")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _function_name(fn: Any) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


def _prompt(value: Any, where: str) -> str | tuple[Message, ...]:
    """A row's prompt as a task holds it: the string, or the messages (copied)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value:
        for k, m in enumerate(value):
            ok = isinstance(m, Mapping) and m.get("role") in ROLES
            if not ok or not isinstance(m.get("content"), str):
                shape = "{'role': 'system'|'user'|'assistant'|'tool', 'content': str}"
                raise DataError(where, None, f"field 'prompt': message {k} is not {shape}")
        return tuple(dict(m) for m in value)
    raise DataError(where, None, "field 'prompt': expected a string or a non-empty list of "
                    f"chat messages, got {type(value).__name__}")  # fmt: skip


def _row_task(row: Any, where: str, default_id: str) -> Task:
    if not isinstance(row, Mapping):
        got = type(row).__name__
        raise DataError(where, None, f"expected a mapping of fields (a dict), got {got}")
    if "prompt" not in row:
        raise DataError(where, None, "field 'prompt': missing")
    if "completion" in row:
        raise DataError(where, None, "field 'completion': reserved (the reward function's "
                        "second argument is the completion); rename the field")  # fmt: skip
    bad = [k for k in row if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise DataError(where, None, f"field {bad[0]!r}: not a Python name, so it cannot "
                        "be passed to the reward function as a keyword")  # fmt: skip
    answer = row.get("answer")
    return Task(
        id=default_id if row.get("id") is None else str(row["id"]),
        prompt=_prompt(row["prompt"], where),
        answer=None if answer is None else str(answer),
        info={k: v for k, v in row.items() if k != "prompt"},
    )


def rows_to_tasks(rows: Iterable[Mapping[str, Any]], *, source: str = "tasks",
                  split: str = "train") -> list[Task]:  # fmt: skip
    """The tasks of `rows` (a list of dicts, a `datasets.Dataset`, any iterable of
    mappings); a bad row is a `DataError` naming `source[i]` and the field. A row without
    `id` is `SPLIT/i`; ids must be unique."""
    if isinstance(rows, str | bytes | Mapping):
        raise DataError(source, None, "expected a list of rows (dicts) or a datasets.Dataset, "
                        f"got {type(rows).__name__}")  # fmt: skip
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        task = _row_task(row, f"{source}[{i}]", f"{split}/{i}")
        if task.id in seen:
            raise DataError(f"{source}[{i}]", None, f"field 'id': {task.id!r} is not unique")
        seen.add(task.id)
        tasks.append(task)
    return tasks


def _accepted_fields(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names `fn` takes after its first two positional parameters (prompt,
    completion); None when it takes any (`**kwargs`) or its signature cannot be read."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    skipped = {p.name for p in positional[:2]}
    return frozenset(p.name for p in params if p.name not in skipped
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))  # fmt: skip


def _as_score(value: Any, name: str) -> Score:
    """A finite number (bools included) is the reward; anything else a failed grade."""
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return Score(value=float(value), provenance={"grader": name})
    shown = _one_line(repr(value))[:80]
    return Score.failed("error", f"{name} returned {shown}, not a finite number",
                        provenance={"grader": name})  # fmt: skip


class FunctionGrader:
    """Scores a rollout with a plain reward function (see the module docstring)."""

    def __init__(self, reward: RewardFunction) -> None:
        if not callable(reward):
            raise TypeError(f"reward: expected a function, got {type(reward).__name__}")
        self.reward = reward
        self.name = f"reward:{_function_name(reward)}"
        self.accepts = _accepted_fields(reward)

    def fields(self, task: Task) -> dict[str, Any]:
        """The keyword arguments of the call for `task`: its fields the function takes."""
        return {k: v for k, v in task.info.items() if self.accepts is None or k in self.accepts}

    def check(self, tasks: Sequence[Task], source: str) -> None:
        """A `DataError` (one line) for the first task the function cannot be called on,
        e.g. a required parameter no field fills; the function is not called."""
        try:
            sig = inspect.signature(self.reward)
        except (TypeError, ValueError):
            return
        for i, task in enumerate(tasks):
            try:
                sig.bind("prompt", "completion", **self.fields(task))
            except TypeError as exc:
                raise DataError(f"{source}[{i}]", None, f"reward {_function_name(self.reward)}"
                                f"{sig}: {exc}") from None  # fmt: skip

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prompt = task.prompt if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]
        try:
            value = self.reward(prompt, rollout.completion, **self.fields(task))
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            why = _one_line(f"{type(exc).__name__}: {exc}")
            return Score.failed("error", why, provenance={"grader": self.name})
        return _as_score(value, self.name)


class FunctionRewardEnv(SingleTurnEnv):
    """The rows as tasks (`train` and `test` splits, in the given order), graded by the
    reward function. Built once per episode: it holds the tasks, never copies them."""

    def __init__(self, reward: RewardFunction, train: Sequence[Task],
                 test: Sequence[Task] = (), *, env_id: str = "reward-v1") -> None:  # fmt: skip
        super().__init__()
        self.env_id = env_id
        self.reward = reward
        self.splits = {"train": train, "test": test}

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"{self.env_id}: unknown split {split!r}; use 'train' or 'test'")
        chosen = self.splits[split]
        return list(chosen if n is None else chosen[:n])

    def default_grader(self) -> FunctionGrader:
        return FunctionGrader(self.reward)


def function_env_id(reward: RewardFunction, train: Sequence[Task], test: Sequence[Task]) -> str:
    """`reward.NAME.DIGEST-v1`: the function's name, and a digest of its module, name and
    source and of the tasks, so the same function on the same rows gets the same id."""
    slug = re.sub(r"[^a-z0-9_]+", "_", _function_name(reward).lower()).strip("_") or "fn"
    try:
        source = inspect.getsource(reward)  # type: ignore[arg-type]
    except (OSError, TypeError):
        source = ""
    where = f"{getattr(reward, '__module__', '')}:{getattr(reward, '__qualname__', slug)}"
    rows = [[t.id, t.prompt, dict(t.info)] for split in (train, test) for t in split]
    data = json.dumps([where, source, len(train), rows], default=repr, sort_keys=True)
    return f"reward.{slug}.{hashlib.sha256(data.encode()).hexdigest()[:12]}-v1"


def register_function_env(
    reward: RewardFunction,
    tasks: Iterable[Mapping[str, Any]],
    eval_tasks: Iterable[Mapping[str, Any]] | None = None,
) -> tuple[str, int]:
    """Check the rows and the function, register a `FunctionRewardEnv` over them (in this
    process) and return its id and the number of held-out tasks."""
    grader = FunctionGrader(reward)
    train = rows_to_tasks(tasks, source="tasks", split="train")
    if not train:
        raise DataError("tasks", None, "no rows")
    test: list[Task] = []
    if eval_tasks is not None:
        test = rows_to_tasks(eval_tasks, source="eval_tasks", split="test")
    grader.check(train, "tasks")
    grader.check(test, "eval_tasks")
    env_id = function_env_id(reward, train, test)
    train = [replace(t, env=env_id) for t in train]
    test = [replace(t, env=env_id) for t in test]
    factory = partial(FunctionRewardEnv, reward, tuple(train), tuple(test), env_id=env_id)
    register(env_id, factory, overwrite=True)
    return env_id, len(test)
