"""Reward functions and a list of rows as an environment: the TRL-style shortcut.

    def correct(prompt, completion, answer):
        return float(completion.strip() == answer)

    rows = [{"prompt": "2 + 2 =", "answer": "4"}, {"prompt": "3 + 5 =", "answer": "8"}]
    rldojo.train({"model": {"name": "tiny-random"}}, tasks=rows, reward=correct)

Each row is one task: `prompt` (a string, or a list of chat messages `{"role", "content"}`),
an optional `id`, and any other fields. `FunctionRewardEnv` poses the rows (one prompt,
one answer: a `SingleTurnEnv`); its grader is a `FunctionGrader`
(`rldojo.envs.reward_functions`: one function or several with weights, per sample or
batched as TRL calls them, and what their failures become).

`rows_to_tasks` checks every row before any work (one line naming the row and the field);
`register_function_env` registers the environment in this process. Its id is readable,
`reward.NAME-v1` from the functions' names (`reward.correct.format-v1` for two); the
`fingerprint` kwarg, a digest of the functions' code and weights and of the rows, picks
the rows and functions among those registered under that id, so a run's config names
exactly what it trained on: a resume with other rows or functions is a config change that
the resume check reports. The functions live in this process: env worker processes and Ray
workers cannot call them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from rldojo.data.loading import DataError
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.envs.reward_functions import FunctionGrader, RewardFunction, function_name
from rldojo.types import Message, Task

__all__ = [
    "FunctionEnv",
    "FunctionGrader",
    "FunctionRewardEnv",
    "RewardFunction",
    "Rewards",
    "fingerprint",
    "function_env_id",
    "register_function_env",
    "rows_to_tasks",
]

Rewards = RewardFunction | Sequence[RewardFunction]
"""One reward function, or several (their weighted sum is the reward)."""

ROLES = ("system", "user", "assistant", "tool")


def _prompt(value: object, where: str) -> str | tuple[Message, ...]:
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
    raise DataError(
        where,
        None,
        "field 'prompt': expected a string or a non-empty list of "
        f"chat messages, got {type(value).__name__}",
    )


def _row_task(row: object, where: str, default_id: str) -> Task:
    if not isinstance(row, Mapping):
        got = type(row).__name__
        raise DataError(where, None, f"expected a mapping of fields (a dict), got {got}")
    if "prompt" not in row:
        raise DataError(where, None, "field 'prompt': missing")
    if "completion" in row:
        raise DataError(
            where,
            None,
            "field 'completion': reserved (the reward function's "
            "second argument is the completion); rename the field",
        )
    bad = [k for k in row if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise DataError(
            where,
            None,
            f"field {bad[0]!r}: not a Python name, so it cannot "
            "be passed to the reward function as a keyword",
        )
    answer = row.get("answer")
    return Task(
        id=default_id if row.get("id") is None else str(row["id"]),
        prompt=_prompt(row["prompt"], where),
        answer=None if answer is None else str(answer),
        info={k: v for k, v in row.items() if k != "prompt"},
    )


def rows_to_tasks(
    rows: Iterable[Mapping[str, Any]], *, source: str = "tasks", split: str = "train"
) -> list[Task]:
    """The tasks of `rows` (a list of dicts, a `datasets.Dataset`, any iterable of
    mappings); a bad row is a `DataError` naming `source[i]` and the field. A row without
    `id` is `SPLIT/i`; ids must be unique."""
    if isinstance(rows, str | bytes | Mapping):
        raise DataError(
            source,
            None,
            f"expected a list of rows (dicts) or a datasets.Dataset, got {type(rows).__name__}",
        )
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        task = _row_task(row, f"{source}[{i}]", f"{split}/{i}")
        if task.id in seen:
            raise DataError(f"{source}[{i}]", None, f"field 'id': {task.id!r} is not unique")
        seen.add(task.id)
        tasks.append(task)
    return tasks


class FunctionRewardEnv(SingleTurnEnv):
    """The rows as tasks (`train` and `test` splits, in the given order), graded by the
    reward functions. Built once per episode: it holds the tasks, never copies them."""

    def __init__(
        self,
        reward: Rewards,
        train: Sequence[Task],
        test: Sequence[Task] = (),
        *,
        env_id: str = "reward-v1",
        weights: Sequence[float] | None = None,
        group_size: int | None = None,
    ) -> None:
        super().__init__()
        self.env_id = env_id
        self.reward, self.weights, self.group_size = reward, weights, group_size
        self.splits = {"train": train, "test": test}

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"{self.env_id}: unknown split {split!r}; use 'train' or 'test'")
        chosen = self.splits[split]
        return list(chosen if n is None else chosen[:n])

    def default_grader(self) -> FunctionGrader:
        return FunctionGrader(self.reward, self.weights, group_size=self.group_size)


def function_env_id(grader: FunctionGrader) -> str:
    """`reward.NAME-v1`: the functions' names, lowercase, joined by dots (the first three
    and how many more)."""
    slugs = [re.sub(r"[^a-z0-9_]+", "_", t.name.lower()).strip("_") or "fn" for t in grader.terms]
    if len(slugs) > 3:
        slugs = [*slugs[:3], f"{len(slugs) - 3}_more"]
    return f"reward.{'.'.join(slugs)}-v1"


def fingerprint(grader: FunctionGrader, train: Sequence[Task], test: Sequence[Task]) -> str:
    """A digest of the functions (module, name, source), their weights and the rows: the
    same functions on the same rows give the same one, in any process."""
    functions = []
    for term in grader.terms:
        try:
            source = inspect.getsource(term.fn)
        except (OSError, TypeError):
            source = ""
        where = f"{getattr(term.fn, '__module__', '')}:{getattr(term.fn, '__qualname__', '')}"
        functions.append([where or function_name(term.fn), source, term.weight])
    rows = [[t.id, t.prompt, dict(t.info)] for split in (train, test) for t in split]
    data = json.dumps([functions, len(train), rows], default=repr, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


_REGISTERED: dict[str, dict[str, Callable[[], FunctionRewardEnv]]] = {}
"""Per environment id, the environments registered in this process, by fingerprint."""


def _make(env_id: str, fingerprint: str) -> FunctionRewardEnv:
    made = _REGISTERED.get(env_id, {}).get(fingerprint)
    if made is None:
        given = "not reward functions and rows given to train() in this process"
        raise ValueError(f"fingerprint {fingerprint!r}: {given}; give them (tasks=, reward=)")
    return made()


@dataclass(frozen=True)
class FunctionEnv:
    """What `register_function_env` registered: the config's `env.id` and `env.kwargs`,
    and the number of held-out tasks (`eval.tasks`)."""

    env_id: str
    kwargs: dict[str, str]
    eval_tasks: int


def register_function_env(
    reward: Rewards,
    tasks: Iterable[Mapping[str, Any]],
    eval_tasks: Iterable[Mapping[str, Any]] | None = None,
    *,
    weights: Sequence[float] | None = None,
    group_size: int | None = None,
) -> FunctionEnv:
    """Check the rows and the functions, and register a `FunctionRewardEnv` over them in
    this process. `group_size`: the samples a batched function is called on at once."""
    grader = FunctionGrader(reward, weights, group_size=group_size)
    train = rows_to_tasks(tasks, source="tasks", split="train")
    if not train:
        raise DataError("tasks", None, "no rows")
    test: list[Task] = []
    if eval_tasks is not None:
        test = rows_to_tasks(eval_tasks, source="eval_tasks", split="test")
    grader.check(train, "tasks")
    grader.check(test, "eval_tasks")
    env_id, digest = function_env_id(grader), fingerprint(grader, train, test)
    train = [replace(t, env=env_id) for t in train]
    test = [replace(t, env=env_id) for t in test]
    fns, ws = tuple(t.fn for t in grader.terms), tuple(t.weight for t in grader.terms)
    _REGISTERED.setdefault(env_id, {})[digest] = partial(
        FunctionRewardEnv,
        fns,
        tuple(train),
        tuple(test),
        env_id=env_id,
        weights=ws,
        group_size=group_size,
    )
    register(env_id, partial(_make, env_id), overwrite=True)
    return FunctionEnv(env_id, {"fingerprint": digest}, len(test))
