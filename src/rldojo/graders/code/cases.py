"""Test cases of code tasks: parsing `Task.info`, converting assert suites, checking outcomes.

Three test forms are supported:

- function calls: ``{"input": [args...], "output": expected}`` (optional ``"kwargs"``,
  ``"compare": "eq" | "close"`` with ``"tol"``), called on ``info["entry_point"]``;
- stdin/stdout programs: ``{"stdin": "...", "stdout": "..."}``;
- assert suites (HumanEval ``def check(candidate): assert candidate(x) == y``, or
  top-level asserts on the entry point): `convert_asserts` turns them into call tests in
  the parent with the AST when every assert is a simple comparison of one call on
  constant arguments with a constant; anything else (loops, helpers, random inputs,
  property checks) goes through the replay path in `replay`.

Expected outputs stay here, in the parent: the sandbox receives only inputs.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rldojo import pyast
from rldojo.graders.code.values import strict_equal

Compare = str  # "eq" | "is" | "truthy" | "falsy" | "close"


@dataclass(frozen=True)
class CallTest:
    """Call the entry point with `args`/`kwargs`; the result must match `expected`."""

    args: tuple[Any, ...]
    expected: object
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    compare: Compare = "eq"
    tol: float = 0.0
    wrap: str | None = None
    """Builtin applied to the output before comparing (``tuple(candidate(x)) == ...``)."""
    held_out: bool = False


@dataclass(frozen=True)
class IOTest:
    """Run the program on `stdin`; its stdout must equal `stdout` (trailing spaces aside)."""

    stdin: str
    stdout: str
    held_out: bool = False


TestCase = CallTest | IOTest


class TestSpecError(ValueError):
    """The task's tests are malformed (a task error: `Score.failed("invalid")`)."""

    __test__ = False  # not a pytest test class despite the name


def parse_test(raw: Mapping[str, Any], *, held_out: bool) -> TestCase:
    if "stdin" in raw or "stdout" in raw:
        return IOTest(str(raw.get("stdin", "")), str(raw.get("stdout", "")), held_out)
    if "input" not in raw or "output" not in raw:
        raise TestSpecError(f"test needs input/output or stdin/stdout, got keys {sorted(raw)}")
    args = raw["input"]
    args = tuple(args) if isinstance(args, list | tuple) else (args,)
    compare = str(raw.get("compare", "eq"))
    if compare not in ("eq", "is", "truthy", "falsy", "close"):
        raise TestSpecError(f"unknown compare mode {compare!r}")
    return CallTest(
        args=args,
        expected=raw["output"],
        kwargs=dict(raw.get("kwargs") or {}),
        compare=compare,
        tol=float(raw.get("tol", 1e-6 if compare == "close" else 0.0)),
        held_out=held_out,
    )


# --- constant evaluation (no code from the test runs here) --------------------------

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
}  # fmt: skip
_SAFE_CALLS: dict[str, Callable[..., Any]] = {
    "tuple": tuple, "list": list, "set": set, "frozenset": frozenset, "sorted": sorted,
    "str": str, "int": int, "float": float, "abs": abs, "len": len, "bool": bool,
}  # fmt: skip


class NotConstant(Exception):
    pass


def _size_ok(value: object) -> bool:
    return not isinstance(value, str | bytes | list | tuple) or len(value) <= 100_000


def const_eval(node: ast.AST) -> Any:
    """Evaluate a constant expression (literals, arithmetic, a few pure builtins)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [const_eval(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        pairs = zip(node.keys, node.values, strict=True)
        return {const_eval(k): const_eval(v) for k, v in pairs}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](const_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = const_eval(node.left), const_eval(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, int) and abs(right) > 512:
            raise NotConstant("exponent too large")
        if isinstance(node.op, ast.Mult):
            count = right if isinstance(left, str | bytes | list | tuple) else left
            if isinstance(count, int) and count > 100_000:
                raise NotConstant("repetition too large")
        value = _BINOPS[type(node.op)](left, right)
        if not _size_ok(value):
            raise NotConstant("value too large")
        return value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _SAFE_CALLS
        and not node.keywords
    ):
        return _SAFE_CALLS[node.func.id](*[const_eval(a) for a in node.args])
    raise NotConstant(ast.dump(node)[:80])


# --- assert conversion ----------------------------------------------------------------


def _candidate_call(node: ast.AST, names: set[str]) -> tuple[ast.Call, str | None] | None:
    """`candidate(...)` or `wrap(candidate(...))` with wrap a builtin container."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id in names:
        return node, None
    inner = node.args[0] if len(node.args) == 1 and not node.keywords else None
    if (
        node.func.id in ("tuple", "list", "set", "sorted")
        and isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id in names
    ):
        return inner, node.func.id
    return None


def _call_test(
    call: ast.Call, wrap: str | None, expected: object, compare: str, tol: float = 0.0
) -> CallTest:
    if any(isinstance(a, ast.Starred) for a in call.args):
        raise NotConstant("starred")
    args = tuple(const_eval(a) for a in call.args)
    kwargs = {k.arg: const_eval(k.value) for k in call.keywords if k.arg}
    if len(kwargs) != len(call.keywords):
        raise NotConstant("**kwargs")
    return CallTest(args, expected, kwargs, compare, tol, wrap)


def _convert_compare(test: ast.Compare, names: set[str]) -> CallTest:
    if len(test.ops) != 1:
        raise NotConstant("chained comparison")
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, ast.Eq | ast.Is):
        found, other = _candidate_call(left, names), right
        if found is None:
            found, other = _candidate_call(right, names), left
        if found is None:
            raise NotConstant("no candidate call")
        expected = const_eval(other)
        if isinstance(op, ast.Is) and not any(expected is v for v in (True, False, None)):
            raise NotConstant("`is` against a non-singleton")
        return _call_test(found[0], found[1], expected, "is" if isinstance(op, ast.Is) else "eq")
    if isinstance(op, ast.Lt | ast.LtE):
        return _convert_close(left, right, isinstance(op, ast.LtE), names)
    raise NotConstant("unsupported comparison")


def _convert_close(left: ast.expr, right: ast.expr, inclusive: bool, names: set[str]) -> CallTest:
    """``abs(candidate(x) - y) < tol`` (or ``<=``)."""
    is_abs = isinstance(left, ast.Call) and isinstance(left.func, ast.Name)
    if not (is_abs and left.func.id == "abs" and len(left.args) == 1):  # type: ignore[attr-defined]
        raise NotConstant("unsupported comparison")
    diff = left.args[0]  # type: ignore[attr-defined]
    found = _candidate_call(diff.left, names) if isinstance(diff, ast.BinOp) else None
    if found is None or found[1] is not None or not isinstance(diff.op, ast.Sub):
        raise NotConstant("unsupported comparison")
    tol = float(const_eval(right))
    if inclusive:  # `close` means strictly below tol
        tol = math.nextafter(tol, math.inf)
    return _call_test(found[0], None, const_eval(diff.right), "close", tol)


def convert_assert(test: ast.expr, names: set[str]) -> CallTest:
    """One assert expression as a call test; raises NotConstant when it is not one."""
    if isinstance(test, ast.Compare):
        return _convert_compare(test, names)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        found = _candidate_call(test.operand, names)
        if found is not None and found[1] is None:
            return _call_test(found[0], None, False, "falsy")
    found = _candidate_call(test, names)
    if found is not None and found[1] is None:
        return _call_test(found[0], None, True, "truthy")
    raise NotConstant("unsupported assert")


def _is_noise(stmt: ast.stmt) -> bool:
    """Statements of a check body that test nothing (docstrings, `assert True`, print)."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr):
        value = stmt.value
        if isinstance(value, ast.Constant):
            return True
        return (
            isinstance(value, ast.Call | ast.Name)
            and getattr(getattr(value, "func", value), "id", "") == "print"
        )
    return (
        isinstance(stmt, ast.Assert)
        and isinstance(stmt.test, ast.Constant)
        and bool(stmt.test.value)
    )


def convert_asserts(test_code: str, entry_point: str) -> list[CallTest] | None:
    """Input/expected pairs of an assert suite, or None when it needs the replay path."""
    try:
        tree = pyast.parse(test_code)
    except SyntaxError as exc:
        raise TestSpecError(f"test code does not parse: {exc}") from exc
    names = {entry_point}
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            if len(node.args.args) != 1:
                return None
            names.add(node.args.args[0].arg)
            body += node.body
        elif isinstance(node, ast.Assert):
            body.append(node)
        elif isinstance(node, ast.Import | ast.ImportFrom | ast.Assign) or _is_noise(node):
            continue  # METADATA = {...}, imports the asserts below never use as calls
        else:
            return None
    tests: list[CallTest] = []
    for stmt in body:
        if _is_noise(stmt):
            continue
        if not isinstance(stmt, ast.Assert):
            return None
        try:
            tests.append(convert_assert(stmt.test, names))
        except (NotConstant, ArithmeticError, TypeError, ValueError):
            return None
    return tests or None


# --- checking outcomes -------------------------------------------------------------------


_WRAPS: dict[str, Callable[[Any], Any]] = {
    "tuple": tuple,
    "list": list,
    "set": set,
    "sorted": sorted,
}


def _wrapped(value: object, wrap: str | None) -> object:
    if wrap is None:
        return value
    if not isinstance(value, list | tuple | set | frozenset | str | dict):
        raise TypeError("not iterable")
    return _WRAPS[wrap](value)


def check_call(test: CallTest, value: object) -> bool:
    """Does a decoded output satisfy the test? (Type-strict; never runs candidate code.)"""
    try:
        value = _wrapped(value, test.wrap)
    except (TypeError, ValueError):
        return False
    if test.compare == "eq":
        return strict_equal(value, test.expected)
    if test.compare == "is":
        return type(value) is type(test.expected) and value == test.expected
    if test.compare in ("truthy", "falsy"):
        return type(value) is bool and value is (test.compare == "truthy")
    if test.compare == "close":
        numbers, expected = (int, float), test.expected
        if type(value) not in numbers or type(expected) not in numbers:
            return False
        assert isinstance(value, int | float) and isinstance(expected, int | float)
        return math.isfinite(value) and abs(value - expected) < test.tol
    return False


def normalize_stdout(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def check_io(test: IOTest, stdout: str) -> bool:
    return normalize_stdout(stdout) == normalize_stdout(test.stdout)
