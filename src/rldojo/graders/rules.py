"""Rule-based graders for single-answer tasks: answer extraction, exact match, math-verify, format.

The answer format is shared with the environments that ask for it (`rldojo.envs.arith.env`,
`rldojo.envs.math.env`): the policy ends its completion with a line

    Answer: <value>

`FormatGrader` rewards exactly that form (a line starting with ``Answer:``, case as
written, followed by a value). Extraction for *correctness* is more forgiving, so that
a right answer in a slightly wrong form is still judged right while the format term
alone carries the penalty; `extract_answer` tries, last occurrence first:

1. the strict ``Answer: <value>`` line;
2. a loose answer line: any case, markdown bold or heading around ``Answer:``
   (``**Answer:** 12``, ``final answer: 12``);
3. the content of the last ``\\boxed{...}``.

The value is cleaned: surrounding ``$``/``\\(...\\)``, markdown ``**``, and trailing
punctuation are removed. No extractable answer is a valid score of 0, not a failure; the
graders that extract an answer flag it (`NO_ANSWER_FLAG`), so a run can count how many
completions never reached an answer (`signal/no_answer`, `rldojo.training.step_metrics`).

`MathVerifyGrader` compares with math-verify (symbolic and numeric equivalence, LaTeX,
fractions). math-verify can hang on adversarial input and its own SIGALRM timeouts do
not work outside the main thread, so its internal timeouts are disabled and every call
runs in an `IsolatedPool` child with a hard timeout. Plain decimals on both sides
(``12``, ``12.0``, ``-3.5``) are compared exactly in-process, which needs no worker.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from importlib import metadata
from typing import Any

from rldojo.types import Rollout, Score, ScoreStatus, Task
from rldojo.workers.isolation import (
    IsolationError,
    IsolationTimeout,
    RemoteError,
)
from rldojo.workers.isolation_pool import IsolatedPool

__all__ = [
    "ANSWER_PREFIX",
    "NO_ANSWER_FLAG",
    "ExactMatchGrader",
    "FormatGrader",
    "MathVerifyGrader",
    "ReferenceParseError",
    "answer_instruction",
    "extract_answer",
    "has_answer_line",
    "last_boxed",
    "math_verify_equal",
    "math_verify_pool",
    "normalize_answer",
]

ANSWER_PREFIX = "Answer:"
"""The required final line is ``f"{ANSWER_PREFIX} <value>"``; envs and graders share it."""
NO_ANSWER_FLAG = "no_answer"
"""`Score.flags` entry of a completion in which no answer could be extracted."""

_STRICT_LINE = re.compile(r"^[ \t]*Answer:[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)
_LOOSE_LINE = re.compile(
    r"^[ \t#>*_]*(?:final[ \t]+)?answer[ \t]*(?:\*\*|__)?[ \t]*[:=]"
    r"[ \t]*(?:\*\*|__)?[ \t]*(\S.*?)[ \t]*$",
    re.MULTILINE | re.IGNORECASE,
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d{1,40})(?:\.\d{1,40})?$")
_MAX_ANSWER_CHARS = 2000
"""Longer extracted answers are cut; nobody's final answer is a page long."""


def answer_instruction(placeholder: str = "number") -> str:
    """The instruction that asks for the answer line, e.g. for ``<number>`` answers."""
    return f"Solve the problem. End with a line of the form '{ANSWER_PREFIX} <{placeholder}>'."


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, with balanced braces; None if none closes."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts[-3:]):  # bounded: unclosed boxes must not cost O(n^2)
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def _clean(value: str) -> str:
    value = value.strip()
    for _ in range(3):  # a few rounds: "**$12$**." needs more than one pass
        before = value
        value = value.strip().strip("*_").strip()
        value = value.rstrip(".,;:!?").rstrip()
        if len(value) >= 2 and value.startswith("$") and value.endswith("$"):
            value = value.strip("$").strip()
        if value.startswith("\\(") and value.endswith("\\)"):
            value = value[2:-2].strip()
        if value.startswith("\\[") and value.endswith("\\]"):
            value = value[2:-2].strip()
        if value == before:
            break
    return value[:_MAX_ANSWER_CHARS]


def extract_answer(text: str, *, strict: bool = False) -> str | None:
    """The final answer in `text` (see the module docstring), or None.

    With `strict=True` only the required ``Answer: <value>`` line counts.
    """
    patterns = [_STRICT_LINE] if strict else [_STRICT_LINE, _LOOSE_LINE]
    for pattern in patterns:
        matches = pattern.findall(text)
        for raw in reversed(matches):
            value = _clean(raw)
            if value:
                return value
    if strict:
        return None
    boxed = last_boxed(text)
    if boxed is not None and _clean(boxed):
        return _clean(boxed)
    return None


def has_answer_line(text: str) -> bool:
    """Whether `text` contains the required ``Answer: <value>`` line."""
    return extract_answer(text, strict=True) is not None


def _as_decimal(text: str) -> Decimal | None:
    """A plain decimal number (no exponent, bounded length) as Decimal, else None."""
    text = text.strip()
    if not _PLAIN_NUMBER.match(text):
        return None
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def normalize_answer(text: str) -> str:
    """Canonical form for string comparison: numbers as plain decimals, else lowercase text.

    ``"12.0"`` and ``"12"`` normalise to ``"12"``; ``" The Cat "`` to ``"the cat"``.
    """
    text = _clean(text)
    number = _as_decimal(text)
    if number is not None:
        if number == number.to_integral_value():
            return str(int(number))
        return format(number.normalize(), "f")
    text = re.sub(r"\s+", " ", text)
    return text.lower()


def _provenance(name: str, version: str, **extra: object) -> dict[str, Any]:
    return {"grader": name, "version": version, **extra}


class ExactMatchGrader:
    """1.0 when the extracted answer equals `Task.answer` after `normalize_answer`, else 0.0.

    Runs in-process (the work is bounded). A task without an answer is `invalid`.
    """

    name = "exact_match"
    version = "1"

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = _provenance(self.name, self.version)
        if task.answer is None:
            return Score.failed(
                "invalid", f"task {task.id} has no reference answer", provenance=prov
            )
        answer = extract_answer(rollout.completion)
        if answer is None:
            return Score(
                0.0,
                components={"correct": 0.0},
                flags=(NO_ANSWER_FLAG,),
                explanation="no answer found",
                provenance=prov,
            )
        correct = normalize_answer(answer) == normalize_answer(task.answer)
        value = 1.0 if correct else 0.0
        return Score(
            value,
            components={"correct": value},
            explanation=f"answer {answer!r} vs reference {task.answer!r}",
            provenance=prov,
        )


class FormatGrader:
    """The format term: does the completion contain the ``Answer: <value>`` line?

    `components["format"]` is 1.0 when present, 0.0 when absent. The value is 0.0 when
    present and ``-penalty`` when absent, so that adding it to a correctness reward in
    [0, 1] gives ``correct - penalty * (1 - format)`` (see `rldojo.graders.composite`).
    """

    name = "format"
    version = "1"

    def __init__(self, penalty: float = 0.5) -> None:
        if penalty < 0:
            raise ValueError(f"FormatGrader penalty must be >= 0, got {penalty}")
        self.penalty = penalty

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        present = has_answer_line(rollout.completion)
        return Score(
            0.0 if present else -self.penalty,
            components={"format": 1.0 if present else 0.0},
            explanation="answer line present" if present else f"no '{ANSWER_PREFIX} ...' line",
            provenance=_provenance(self.name, self.version, penalty=self.penalty),
        )


# ------------------------------------------------------------------ math-verify in a worker


def _warm_math_verify() -> None:
    """Worker initializer: pay the math-verify/sympy import before the first call."""
    # We disable math-verify's own timeouts on purpose; its warning about that is noise.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse, verify

    verify(
        parse("$1$", parsing_timeout=None), parse("$1$", parsing_timeout=None), timeout_seconds=None
    )


def _latex(text: str) -> str:
    """Wrap a bare answer in ``$...$`` so math-verify reads it as LaTeX."""
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


class ReferenceParseError(ValueError):
    """The task's reference answer could not be parsed (the task's fault, not the policy's)."""


def math_verify_equal(reference: str, answer: str) -> bool:
    """True iff math-verify judges `answer` equivalent to `reference` (runs in the worker).

    Raises `ReferenceParseError` when the reference itself cannot be parsed, which the
    grader reports as `invalid` rather than a reward of 0.
    """
    from math_verify import parse, verify

    gold = parse(_latex(reference), parsing_timeout=None)
    if not gold:
        raise ReferenceParseError(f"reference answer {reference!r} could not be parsed")
    pred = parse(_latex(answer), parsing_timeout=None)
    if not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


_shared_pool: IsolatedPool | None = None
_shared_lock = threading.Lock()


def math_verify_pool() -> IsolatedPool:
    """The process-wide pool of warm math-verify workers (created and started on first use).

    Sized ``min(4, cpus // 2)``, at least 1. Shared so that many env instances do not
    each start their own children; `close()` it to stop them (a later call restarts it).
    """
    global _shared_pool
    with _shared_lock:
        if _shared_pool is None or _shared_pool.closed:
            size = max(1, min(4, (os.cpu_count() or 2) // 2))
            _shared_pool = IsolatedPool(size, initializer=_warm_math_verify)
            _shared_pool.start()
            atexit.register(_shared_pool.close)
        return _shared_pool


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


class MathVerifyGrader:
    """1.0 when math-verify finds the extracted answer equivalent to `Task.answer`, else 0.0.

    Args:
        timeout_s: hard limit per comparison; past it the worker is killed and the score
            is `timeout`.
        pool: the worker pool; defaults to the shared `math_verify_pool()`.
        compare: the function run in the worker, ``compare(reference, answer) -> bool``;
            a picklable top-level function (a seam for tests and custom checkers).

    Statuses: no answer found -> ok, 0.0 (flagged `no_answer`); reference missing or
    unparseable -> `invalid`; worker timeout -> `timeout`; worker crash or other
    exception -> `error`.
    """

    name = "math_verify"
    version = "1"

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        pool: IsolatedPool | None = None,
        compare: Callable[[str, str], bool] = math_verify_equal,
    ) -> None:
        self.timeout_s = timeout_s
        self._pool = pool
        self._compare = compare

    def _prov(self) -> dict[str, Any]:
        return _provenance(
            self.name,
            self.version,
            math_verify=_package_version("math-verify"),
            timeout_s=self.timeout_s,
        )

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = self._prov()
        if task.answer is None:
            return Score.failed(
                "invalid", f"task {task.id} has no reference answer", provenance=prov
            )
        answer = extract_answer(rollout.completion)
        if answer is None:
            return Score(
                0.0,
                components={"correct": 0.0},
                flags=(NO_ANSWER_FLAG,),
                explanation="no answer found",
                provenance=prov,
            )
        ours, ref = _as_decimal(answer), _as_decimal(task.answer)
        if ours is not None and ref is not None:
            correct = ours == ref
        else:
            try:
                pool = self._pool or math_verify_pool()
                correct = await pool.call(
                    self._compare, task.answer, answer, timeout_s=self.timeout_s
                )
            except IsolationTimeout as exc:
                return Score.failed("timeout", f"math-verify: {exc}", provenance=prov)
            except RemoteError as exc:
                status: ScoreStatus = (
                    "invalid" if exc.exc_type == ReferenceParseError.__name__ else "error"
                )
                return Score.failed(status, f"math-verify: {exc}", provenance=prov)
            except IsolationError as exc:  # IsolationCrash: the worker died
                return Score.failed("error", f"math-verify: {exc}", provenance=prov)
            except Exception as exc:  # e.g. a closed pool; never a reward of 0
                return Score.failed(
                    "error", f"math-verify: {type(exc).__name__}: {exc}", provenance=prov
                )
        value = 1.0 if correct else 0.0
        return Score(
            value,
            components={"correct": value},
            explanation=f"answer {answer!r} vs reference {task.answer!r}",
            provenance=prov,
        )
