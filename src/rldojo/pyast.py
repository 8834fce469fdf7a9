"""Parsing Python source from several threads: `parse` and `literal_eval` under one lock.

CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide state, so two
threads building ASTs at once can fail with `SystemError: AST constructor recursion depth
mismatch` (CPython gh-106905; seen here when two threads graded HumanEval suites).
Graders and environments parse model-written text from grading threads, so every
in-process parse goes through this module, one at a time. Parsing a test suite takes
well under a millisecond, so the lock costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """`ast.parse`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)


def literal_eval(text: str) -> Any:
    """`ast.literal_eval` (which parses), one thread at a time."""
    with _LOCK:
        return ast.literal_eval(text)
