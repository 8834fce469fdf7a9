"""math-v1: math problems from the user's file (JSONL/Parquet) or a Hugging Face dataset.

Each row has a question and a reference answer:

    {"id": "p1", "problem": "What is 1/2 + 1/4?", "answer": "\\\\frac{3}{4}"}

The question comes from the first of ``prompt``/``problem``/``question`` present (or
`prompt_field`), the reference from ``answer``/``solution`` (or `answer_field`). A
reference is cut down to the final answer when it is a worked solution: the content of
its last ``\\boxed{...}`` (MATH style), or the text after ``####`` (GSM8K style). Bad
rows raise `rldojo.data.loading.DataError` naming the file, line and field.

The user message is the question followed by the instruction to end with
``Answer: <answer>``; the reward is `rldojo.graders.composite.answer_reward`:
``correct - format_penalty * (1 - format)``, correctness by math-verify (LaTeX,
fractions, symbolic equivalence) in an isolated worker with a hard timeout.

Splits: with `test_path`, ``train`` is `path` and ``test`` is `test_path`. Otherwise a
fixed `test_fraction` of the questions goes to ``test`` by a hash of the question text:
the split does not depend on the seed or the file order, and duplicate questions never
straddle it. ``tasks(split, seed=s)`` shuffles the split with ``random.Random`` seeded
from ``s`` and returns the first `n`.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rldojo.data.loading import (
    DataError,
    read_rows,
    require_any_field,
    require_data_file,
    require_field,
)
from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.kwargs import EnvKwargs, given_kwargs
from rldojo.envs.registry import register
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader, answer_reward
from rldojo.graders.rules import answer_instruction, last_boxed
from rldojo.types import Task

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "MATH_INSTRUCTION",
    "MathEnv",
    "MathKwargs",
    "reference_answer",
]

ENV_ID = "math-v1"
MATH_INSTRUCTION = answer_instruction("answer")
"""``Solve the problem. End with a line of the form 'Answer: <answer>'.``"""
DEFAULT_SYSTEM_PROMPT = "You are a concise math assistant."
PROMPT_FIELDS = ("prompt", "problem", "question")
ANSWER_FIELDS = ("answer", "solution")
_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
_NUMBER_WITH_COMMAS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def reference_answer(text: str) -> str:
    """The final answer inside a reference: last ``\\boxed{}``, else after ``####``, else all."""
    boxed = last_boxed(text)
    if boxed and boxed.strip():
        return boxed.strip()
    match = _GSM8K_ANSWER.search(text)
    if match:
        value = match.group(1).strip()
        return value.replace(",", "") if _NUMBER_WITH_COMMAS.match(value) else value
    return text.strip()


def _is_test(question: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"{ENV_ID}-split:{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


Record = tuple[str, str, str, str | None, dict[str, Any]]
"""(task id suffix, question, reference answer, full solution or None, extra info)."""


def _records(
    rows: Iterable[tuple[int, dict[str, Any]]],
    source: str,
    prompt_fields: Sequence[str],
    answer_fields: Sequence[str],
    id_field: str,
) -> list[Record]:
    """Validate rows and turn them into records; `source` names the file in errors."""
    records: list[Record] = []
    first_line: dict[str, int] = {}
    stem = Path(source).name
    for line, row in rows:
        _, question = require_any_field(row, prompt_fields, source, line)
        if not question.strip():
            raise DataError(source, line, f"field {'|'.join(prompt_fields)!r}: empty")
        answer_name, raw = require_any_field(row, answer_fields, source, line, (str, int, float))
        answer = reference_answer(str(raw)) if isinstance(raw, str) else str(raw)
        if not answer:
            raise DataError(source, line, f"field {answer_name!r}: empty")
        if row.get(id_field) is not None:
            ident = str(require_field(row, id_field, source, line, (str, int)))
            if ident in first_line:
                raise DataError(
                    source,
                    line,
                    f"field {id_field!r}: duplicate id {ident!r} "
                    f"(first on line {first_line[ident]})",
                )
            first_line[ident] = line
        else:
            ident = f"{stem}:{line}"
        used = {answer_name, id_field, *prompt_fields}
        info = {k: v for k, v in row.items() if k not in used}
        info["source"] = f"{source}:{line}"
        solution = raw if isinstance(raw, str) and answer != raw.strip() else None
        records.append((ident, question, answer, solution, info))
    if not records:
        raise DataError(source, None, "no rows")
    return records


_cache: dict[tuple[Any, ...], list[Record]] = {}
_cache_lock = threading.Lock()


def _load_file(
    path: str, prompt_fields: Sequence[str], answer_fields: Sequence[str], id_field: str
) -> list[Record]:
    """Records of a file, cached by (path, size, mtime, fields) so many env instances are cheap."""
    stat = os.stat(require_data_file(path))
    key = (
        os.path.abspath(path),
        stat.st_size,
        stat.st_mtime_ns,
        tuple(prompt_fields),
        tuple(answer_fields),
        id_field,
    )
    with _cache_lock:
        if key not in _cache:
            _cache[key] = _records(read_rows(path), path, prompt_fields, answer_fields, id_field)
        return _cache[key]


def _load_hf(
    spec: str | Sequence[str],
    prompt_fields: Sequence[str],
    answer_fields: Sequence[str],
    id_field: str,
) -> list[Record]:
    """Records of a hub dataset: ``name``, ``(name, split)`` or ``(name, config, split)``."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    if not 1 <= len(parts) <= 3:
        raise ValueError(
            f"{ENV_ID}: hf_dataset must be name, (name, split) or (name, config, split); "
            f"got {spec!r}"
        )
    name, config, split = (
        parts[0],
        (parts[1] if len(parts) == 3 else None),
        (parts[-1] if len(parts) > 1 else "train"),
    )
    try:
        import datasets  # optional: only for users who ask for a hub dataset
    except ImportError:
        raise ImportError(
            f"{ENV_ID}: hf_dataset={spec!r} needs the 'datasets' package (pip install datasets); "
            "or export the data to JSONL/Parquet and pass path="
        ) from None
    data = datasets.load_dataset(name, config, split=split)
    source = f"hf:{name}" + (f"/{config}" if config else "") + f"[{split}]"
    rows = ((i, dict(row)) for i, row in enumerate(data, start=1))
    return _records(rows, source, prompt_fields, answer_fields, id_field)


class MathKwargs(EnvKwargs):
    """The kwargs of math-v1 (`[env] kwargs`): exactly one of `path` and `hf_dataset`."""

    path: str | Path | None = None
    """JSONL/JSON/Parquet file of problems (or use `hf_dataset`)."""
    test_path: str | Path | None = None
    """A separate test file; otherwise `test_fraction` of `path` is held out."""
    hf_dataset: str | Sequence[str] | None = None
    """``name``, ``[name, split]`` or ``[name, config, split]`` loaded with
    `datasets.load_dataset` (needs `datasets`; downloads unless cached or offline)."""
    prompt_field: str | None = None
    """The question field; None: the first of prompt, problem, question."""
    answer_field: str | None = None
    """The reference field; None: the first of answer, solution."""
    id_field: str = "id"
    """Optional field with a unique id per row."""
    test_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Held-out share, in [0, 1), when there is no `test_path`."""
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """The system message; None for none."""
    answer_format: str = MATH_INSTRUCTION
    """The instruction appended to every question."""
    format_penalty: float = FORMAT_PENALTY
    """Reward lost when the ``Answer:`` line is missing."""
    grader_timeout_s: float = Field(5.0, gt=0)
    """Hard timeout of one math-verify comparison, in seconds."""

    @model_validator(mode="after")
    def _one_source(self) -> MathKwargs:
        if (self.path is None) == (self.hf_dataset is None):
            raise ValueError("pass exactly one of path and hf_dataset")
        return self


class MathEnv(SingleTurnEnv):
    """Math problems with reference answers from a file or hub dataset (see module
    docstring); built from `MathKwargs` (or keywords validated against it)."""

    env_id = ENV_ID
    Kwargs = MathKwargs
    expected_answer = "a line 'Answer: <answer>'"
    """What the grader extracts an answer from (`rldojo.training.no_signal` names it)."""

    def __init__(self, kwargs: MathKwargs | None = None, /, **keywords: object) -> None:
        super().__init__()
        k = self.kwargs = given_kwargs(ENV_ID, MathKwargs, kwargs, keywords)
        prompts = (k.prompt_field,) if k.prompt_field else PROMPT_FIELDS
        answers = (k.answer_field,) if k.answer_field else ANSWER_FIELDS
        if k.path is not None:
            self._records = _load_file(os.fspath(k.path), prompts, answers, k.id_field)
        else:
            assert k.hf_dataset is not None
            self._records = _load_hf(k.hf_dataset, prompts, answers, k.id_field)
        self._test_records = (
            _load_file(os.fspath(k.test_path), prompts, answers, k.id_field)
            if k.test_path is not None
            else None
        )
        self.system_prompt = k.system_prompt
        self.answer_format = k.answer_format

    def _split(self, split: str) -> list[Record]:
        if split not in ("train", "test"):
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        if self._test_records is not None:
            return self._records if split == "train" else self._test_records
        want_test = split == "test"
        return [r for r in self._records if _is_test(r[1], self.kwargs.test_fraction) == want_test]

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        records = list(self._split(split))
        random.Random(f"{ENV_ID}:{split}:{seed}").shuffle(records)
        if n is not None:
            records = records[:n]
        return [self._make_task(record) for record in records]

    def _make_task(self, record: Record) -> Task:
        ident, question, answer, solution, info = record
        info = dict(info, question=question)
        if solution is not None:
            info["solution"] = solution
        return Task(
            id=f"{ENV_ID}/{ident}",
            prompt=f"{question}\n{self.answer_format}",
            answer=answer,
            info=info,
            env=ENV_ID,
        )

    def default_grader(self) -> CompositeGrader:
        """``correct - format_penalty * (1 - format)``, correctness by math-verify."""
        k = self.kwargs
        return answer_reward(format_penalty=k.format_penalty, timeout_s=k.grader_timeout_s)


register(ENV_ID, MathEnv)
