"""A small, safe arithmetic expression language: the `calculate_output` of multi graders.

    expr = compile_expr("0.5 * fuzzy + 0.5 * max(exact, 0.2) ^ 2", names={"fuzzy", "exact"})
    expr.evaluate({"fuzzy": 0.8, "exact": 1.0})      # -> 0.9

Grammar (a hand-written Pratt parser; nothing is passed to Python's `eval`):

    numbers      1, 0.5, .5, 1e-3
    names        grader names: letters, digits, `_` (not starting with a digit)
    operators    + - * / ^ (power, right-associative; `**` is accepted too), unary + -
    functions    min(a, b, ...) max(a, b, ...) abs(x) floor(x) ceil(x) exp(x) sqrt(x) log(x)
    parentheses

These are the operators and functions OpenAI documents for multi graders. All arithmetic
is in floats, so results are bounded: overflow, division by zero and domain errors
(`sqrt(-1)`, `log(0)`) raise `ExprError` instead of returning inf/NaN. Syntax errors name
the column. Expressions longer than 2,000 characters or nested deeper than 50 are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FUNCTIONS", "Expr", "ExprError", "compile_expr"]

MAX_LENGTH = 2000
MAX_DEPTH = 50


class ExprError(ValueError):
    """The expression is malformed, names an unknown grader, or cannot be evaluated."""


def _min(*args: float) -> float:
    return min(args)


def _max(*args: float) -> float:
    return max(args)


FUNCTIONS: dict[str, tuple[Callable[..., float], int | None]] = {
    "min": (_min, None),
    "max": (_max, None),
    "abs": (abs, 1),
    "floor": (lambda x: float(math.floor(x)), 1),
    "ceil": (lambda x: float(math.ceil(x)), 1),
    "exp": (math.exp, 1),
    "sqrt": (math.sqrt, 1),
    "log": (math.log, 1),
}
"""Function name -> (implementation, arity; None = one or more arguments)."""

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|[-+*/^(),]))"
)


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Name:
    id: str


@dataclass(frozen=True)
class Unary:
    op: str  # "-" | "+"
    operand: Node


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / ^
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Node, ...]


Node = Num | Name | Unary | Bin | Call

_BINDING = {"+": 10, "-": 10, "*": 20, "/": 20, "^": 30, "**": 30}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    col: int


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise ExprError(f"unexpected character {text[col]!r} at column {col + 1}")
        kind = m.lastgroup or "op"
        tokens.append(_Tok(kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
    tokens.append(_Tok("end", "", len(text) + 1))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> _Tok:
        return self.tokens[self.i]

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            got = repr(tok.text) if tok.kind != "end" else "end of expression"
            raise ExprError(f"expected {text!r} at column {tok.col}, got {got}")

    def parse(self, min_bp: int = 0) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {MAX_DEPTH}")
        left = self.prefix()
        while True:
            tok = self.peek()
            bp = _BINDING.get(tok.text, -1) if tok.kind == "op" else -1
            if bp <= min_bp:
                break
            self.take()
            right_assoc = tok.text in ("^", "**")
            right = self.parse(bp - 1 if right_assoc else bp)
            left = Bin("^" if tok.text == "**" else tok.text, left, right)
        self.depth -= 1
        return left

    def prefix(self) -> Node:
        tok = self.take()
        if tok.kind == "num":
            return Num(float(tok.text))
        if tok.kind == "name":
            if self.peek().text == "(":
                return self.call(tok)
            return Name(tok.text)
        if tok.text in ("-", "+"):
            operand = self.parse(25)  # binds tighter than * but looser than ^: -x^2 = -(x^2)
            return Unary(tok.text, operand)
        if tok.text == "(":
            inner = self.parse()
            self.expect(")")
            return inner
        got = repr(tok.text) if tok.kind != "end" else "end of expression"
        raise ExprError(f"unexpected {got} at column {tok.col}")

    def call(self, name: _Tok) -> Node:
        if name.text not in FUNCTIONS:
            known = ", ".join(FUNCTIONS)
            raise ExprError(f"unknown function {name.text!r} at column {name.col} ({known})")
        self.expect("(")
        args: list[Node] = [self.parse()]
        while self.peek().text == ",":
            self.take()
            args.append(self.parse())
        self.expect(")")
        arity = FUNCTIONS[name.text][1]
        if arity is not None and len(args) != arity:
            raise ExprError(f"{name.text}() takes {arity} argument, got {len(args)}")
        return Call(name.text, tuple(args))


def _names(node: Node) -> set[str]:
    if isinstance(node, Name):
        return {node.id}
    if isinstance(node, Unary):
        return _names(node.operand)
    if isinstance(node, Bin):
        return _names(node.left) | _names(node.right)
    if isinstance(node, Call):
        return set().union(*(_names(a) for a in node.args))
    return set()


def _eval(node: Node, values: Mapping[str, float]) -> float:
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Name):
        return float(values[node.id])
    if isinstance(node, Unary):
        operand = _eval(node.operand, values)
        return -operand if node.op == "-" else operand
    if isinstance(node, Call):
        return float(FUNCTIONS[node.fn][0](*(_eval(a, values) for a in node.args)))
    left, right = _eval(node.left, values), _eval(node.right, values)
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    if node.op == "/":
        return left / right
    result = left**right
    if isinstance(result, complex):
        raise ValueError("negative number to a fractional power")
    return float(result)


@dataclass(frozen=True)
class Expr:
    """A parsed expression; `names` are the variables it reads."""

    text: str
    tree: Node
    names: frozenset[str]

    def evaluate(self, values: Mapping[str, float]) -> float:
        """The value for `values` (every name in `self.names`); ExprError if not finite."""
        missing = self.names - set(values)
        if missing:
            raise ExprError(f"no value for {sorted(missing)}")
        try:
            result = _eval(self.tree, values)
        except ZeroDivisionError:
            raise ExprError(f"division by zero in {self.text!r}") from None
        except (OverflowError, ValueError) as exc:
            raise ExprError(f"cannot evaluate {self.text!r}: {exc}") from None
        if not math.isfinite(result):
            raise ExprError(f"{self.text!r} is not finite ({result})")
        return result


def compile_expr(text: str, names: Iterable[str] | None = None) -> Expr:
    """Parse `text`; with `names`, every variable must be one of them (ExprError otherwise)."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression longer than {MAX_LENGTH} characters")
    parser = _Parser(text)
    tree = parser.parse()
    tok = parser.peek()
    if tok.kind != "end":
        raise ExprError(f"unexpected {tok.text!r} at column {tok.col}")
    used = frozenset(_names(tree))
    if names is not None:
        allowed = set(names)
        unknown = sorted(used - allowed)
        if unknown:
            raise ExprError(f"unknown name {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    return Expr(text, tree, used)
