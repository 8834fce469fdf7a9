"""The environment of a reinforcement fine-tuning job: the rows of OpenAI RFT JSONL files.

An RFT row is ``{"messages": [{"role": ..., "content": ...}, ...], <any other fields>}``:
the messages are the prompt, the other fields are what the grader reads as
``{{item.field}}``. `read_rft_rows(path, name, spec)` checks every row up front and raises
`DataError` naming the file, line and field (a row without `messages`, a message without
a string `content`, a field the grader references that the row lacks); `row_task` makes
one row a `Task`; `RftEnv` poses the rows of the training file (split `train`) and of the
validation file (split `test`). The job's grader spec replaces the environment's grader
(`grader.spec` in the job's config), so `default_grader` is never asked for.

The trainer builds it from its config as ``env.id = "rldojo.service.rft_env:RftEnv"``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

from rldojo.data.loading import DataError, read_rows
from rldojo.envs.base import SingleTurnEnv
from rldojo.graders.base import Grader
from rldojo.graders.openai_templates import TemplateError, lookup
from rldojo.graders.template_check import spec_templates
from rldojo.types import Task

__all__ = ["ENV_ID", "RftEnv", "read_rft_rows", "row_task"]

ENV_ID = "rldojo.service.rft_env:RftEnv"
_ROLES = ("system", "developer", "user", "assistant", "tool")


def _item_paths(spec: Mapping[str, Any] | None) -> list[tuple[str, str, list[str | int]]]:
    """(spec field, variable text, path) of every ``{{item.…}}`` the grader reads."""
    from rldojo.graders.openai_templates import template_paths

    found = []
    for field, template in spec_templates(spec or {}):
        for namespace, parts in template_paths(template, field):
            if namespace == "item":
                found.append((field, "item." + ".".join(str(p) for p in parts), parts))
    return found


def _check_messages(row: Mapping[str, Any], where: str, line: int) -> list[dict[str, str]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataError(where, line, "field 'messages': missing or not a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise DataError(
                where, line, f"field 'messages[{i}].role': expected one of {', '.join(_ROLES)}"
            )
        if not isinstance(m.get("content"), str):
            raise DataError(where, line, f"field 'messages[{i}].content': not a string")
        role = "system" if m["role"] == "developer" else str(m["role"])
        out.append({"role": role, "content": str(m["content"])})
    return out


def read_rft_rows(
    path: str | os.PathLike[str], name: str | None = None, spec: Mapping[str, Any] | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """Every row of an RFT file, checked (module docstring); `name` replaces the path in
    messages (the uploaded file's name rather than where the service stored it)."""
    where = name or os.fspath(path)
    referenced = _item_paths(spec)
    rows = []
    try:
        for line, row in read_rows(path):
            _check_messages(row, where, line)
            for field, variable, parts in referenced:
                try:
                    lookup("item", parts, {}, row)
                except KeyError:
                    raise DataError(
                        where,
                        line,
                        f"field {variable[5:]!r}: missing (the grader's {field} "
                        f"reads {{{{{variable}}}}})",
                    ) from None
            rows.append((line, row))
    except DataError as exc:
        if exc.path == os.fspath(path):  # read_rows names the stored path: use the name
            raise DataError(where, exc.line, str(exc).split(": ", 1)[1]) from None
        raise
    if not rows:
        raise DataError(where, None, "no rows")
    return rows


def row_task(line: int, row: Mapping[str, Any], split: str, where: str) -> Task:
    """The task of one checked row (`DataError` for bad messages): the messages are the
    prompt, every field of the row is the grader's `item`."""
    answer = row.get("answer", row.get("reference_answer"))
    return Task(
        id=f"{split}-{line}",
        prompt=_check_messages(row, where, line),
        info=dict(row),
        env=ENV_ID,
        answer=None if answer is None else str(answer),
    )


class RftEnv(SingleTurnEnv):
    """Tasks from RFT files (module docstring).

    Args:
        train_path: the training file (JSONL rows with `messages`).
        validation_path: the validation file (the `test` split); None: no test split.
        name: the training file's name in error messages.
        validation_name: the validation file's name in error messages.
    """

    env_id = ENV_ID

    def __init__(
        self,
        train_path: str,
        validation_path: str | None = None,
        name: str | None = None,
        validation_name: str | None = None,
    ) -> None:
        super().__init__()
        self._splits = {"train": self._tasks(train_path, name, "train")}
        self._splits["test"] = (
            self._tasks(validation_path, validation_name, "test") if validation_path else []
        )

    @staticmethod
    def _tasks(path: str, name: str | None, split: str) -> list[Task]:
        return [row_task(line, row, split, name or path) for line, row in read_rft_rows(path, name)]

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> Sequence[Task]:
        tasks = list(self._splits.get(split, []))
        random.Random(seed).shuffle(tasks)
        return tasks if n is None else tasks[:n]

    def default_grader(self) -> Grader:
        raise TemplateError(f"{ENV_ID}: a job's grader comes from its spec (grader.spec)")
