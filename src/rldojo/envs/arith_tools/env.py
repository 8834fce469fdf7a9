"""arith-tools-v1's environment: tasks, the ``calculator`` and ``python`` tools, `ArithToolsEnv`.

The task levels, the tool gating and the reward are described in `rldojo.envs.arith_tools`;
the reward itself is `rldojo.envs.arith_tools.grader.ArithToolsGrader`.
"""

from __future__ import annotations

import ast
import functools
import math
import os
import random
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

from pydantic import field_validator

from rldojo import pyast
from rldojo.envs.arith_tools.grader import ArithToolsGrader, ArithToolsReward
from rldojo.envs.kwargs import EpisodeLimits, ToolEnvKwargs, subset_of
from rldojo.envs.multiturn import ToolEnv
from rldojo.envs.tools import Tool, ToolError
from rldojo.types import Task

__all__ = [
    "ENV_ID",
    "ArithToolsEnv",
    "ArithToolsKwargs",
    "SandboxUnavailableError",
    "calculate",
    "calculator_tool",
    "python_tool",
    "sandbox_status",
]

ENV_ID = "arith-tools-v1"
DEFAULT_N = {"train": 1000, "test": 200}
MAX_EXPRESSION_CHARS = 2000
MAX_RESULT_BITS = 200_000
"""Results larger than this (about 60,000 digits) are refused, bounding CPU and memory."""

# ------------------------------------------------------------------ calculator

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: Fraction(a) / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_FUNCTIONS = {
    "abs": abs,
    "gcd": math.gcd,
    "lcm": math.lcm,
    "isqrt": math.isqrt,
    "factorial": math.factorial,
    "min": min,
    "max": max,
}


def _bits(x: Fraction | int) -> int:
    f = Fraction(x)
    return max(f.numerator.bit_length(), f.denominator.bit_length())


def _power(base: Fraction | int, exp: Fraction | int) -> Fraction | int:
    if Fraction(exp).denominator != 1:
        raise ToolError("only whole-number exponents are exact; use a whole exponent")
    e = int(exp)
    if _bits(base) * abs(e) > MAX_RESULT_BITS:
        raise ToolError("result too large")
    if e < 0:
        if base == 0:
            raise ToolError("division by zero")
        return Fraction(base) ** e  # int ** -n would be a float
    return base**e


def _eval(node: ast.AST) -> Fraction | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value if isinstance(node.value, int) else Fraction(repr(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ToolError(f"operator {type(node.op).__name__} is not supported")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise ToolError("division by zero")
        if isinstance(node.op, ast.Mult) and _bits(left) + _bits(right) > MAX_RESULT_BITS:
            raise ToolError("result too large")
        return op(left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None:
            raise ToolError(f"unknown function {node.func.id!r}; known: {', '.join(_FUNCTIONS)}")
        args = [_eval(a) for a in node.args]
        if fn in (math.gcd, math.lcm, math.isqrt, math.factorial):
            if any(Fraction(a).denominator != 1 for a in args):
                raise ToolError(f"{node.func.id} needs whole numbers")
            args = [int(a) for a in args]
            if fn is math.factorial and args and args[0] > 5000:
                raise ToolError("factorial argument too large (max 5000)")
        try:
            return fn(*args)  # type: ignore[operator]
        except (TypeError, ValueError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
    raise ToolError(f"unsupported syntax: {ast.dump(node)[:60]}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers and fractions, ``^`` = power)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/")
    text = re.sub(r"(?<=\d)_(?=\d)", "", text)
    try:
        tree = pyast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r}") from None
    try:
        value = _eval(tree)
    except RecursionError:
        raise ToolError("expression nested too deeply") from None
    except (ValueError, ArithmeticError) as exc:  # e.g. 1e999 (infinite), isqrt(-1)
        raise ToolError(f"cannot evaluate {expression!r}: {exc}") from None
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator} (about {float(value):.12g})"


def calculator_tool() -> Tool:
    """The ``calculator`` tool: exact arithmetic (see `calculate`)."""

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression exactly: + - * / // % ** (or ^), parentheses,
        and abs, gcd, lcm, isqrt, factorial, min, max.

        Args:
            expression: e.g. "123456789 * 987654321 - 2**40".
        """
        return calculate(expression)

    return Tool.from_function(calculator)


# ------------------------------------------------------------------ python in the sandbox


class SandboxUnavailableError(RuntimeError):
    """The python tool was required but `rldojo.sandbox` is missing or does not work here."""


@functools.lru_cache(maxsize=1)
def sandbox_status() -> tuple[bool, str]:
    """``(usable, why)`` for the python tool: is `rldojo.sandbox` importable and working?"""
    try:
        from rldojo import sandbox
    except ImportError as exc:
        return False, f"rldojo.sandbox is not importable: {exc}"
    try:
        result = sandbox.probe()
    except Exception as exc:  # a probe that crashes means no sandbox, not a crashed env
        return False, f"sandbox probe failed: {type(exc).__name__}: {exc}"
    weak_ok = os.environ.get("RLDOJO_SANDBOX_ALLOW_WEAK", "") == "1"
    if result.strict or (weak_ok and result.usable):
        return True, result.mode
    return False, f"sandbox not usable here ({result.mode}):\n{result.summary}"


def python_tool(*, timeout_s: float = 10.0, memory_mb: int = 256) -> Tool:
    """The ``python`` tool: run a program in `rldojo.sandbox`; stdout and stderr come back.

    Raises `SandboxUnavailableError` when the sandbox cannot run here.
    """
    usable, why = sandbox_status()
    if not usable:
        raise SandboxUnavailableError(f"the python tool needs the sandbox: {why}")

    async def python(code: str) -> dict[str, Any]:
        """Run a Python program in an isolated sandbox (no network, no files kept) and
        return its printed output. Print what you need.

        Args:
            code: the program, e.g. "print(2**100)".
        """
        from rldojo.sandbox import run_async

        result = await run_async(code, timeout_s=timeout_s, memory_mb=memory_mb)
        if result.status == "sandbox_error":  # infrastructure, not the model's fault
            raise RuntimeError(f"sandbox failed: {result.error}")
        return {
            "status": result.status,
            "returncode": result.returncode,
            "stdout": result.stdout[-4000:],
            "stderr": result.stderr[-2000:],
        }

    return Tool.from_function(python)


# ------------------------------------------------------------------ tasks


def _digits(rng: random.Random, lo: int, hi: int) -> int:
    n = rng.randint(lo, hi)
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _problem(rng: random.Random, level: int) -> tuple[str, int]:
    """(question, answer) of one level."""
    if level == 1:
        a, b = _digits(rng, 12, 16), _digits(rng, 12, 16)
        return f"What is {a} * {b}?", a * b
    if level == 2:
        if rng.random() < 0.5:
            a, b, c, d = (_digits(rng, 10, 14) for _ in range(4))
            return f"What is {a} * {b} - {c} * {d}?", a * b - c * d
        base, exp = rng.randint(101, 999), rng.randint(9, 16)
        return f"What is {base} to the power of {exp}?", base**exp
    if level == 3:
        a, b, c = _digits(rng, 9, 12), _digits(rng, 9, 12), _digits(rng, 5, 8)
        base, exp, d, m = (
            rng.randint(11, 99),
            rng.randint(6, 12),
            _digits(rng, 4, 6),
            _digits(rng, 16, 18),
        )
        value = ((a * b + base**exp) // c - d) % m
        text = f"(({a} * {b} + {base}^{exp}) // {c} - {d}) mod {m}"
        return f"Compute {text}, where // is integer division (rounding down).", value
    start, pct, years = _digits(rng, 10, 14), rng.randint(3, 19), rng.randint(10, 25)
    value = start
    for _ in range(years):
        value = value * (100 + pct) // 100
    return (
        f"A fund holds {start} coins and grows by {pct}% every year; after each year the "
        f"balance is rounded down to whole coins. How many coins does it hold after "
        f"{years} years?",
        value,
    )


# ------------------------------------------------------------------ env


class ArithToolsKwargs(ToolEnvKwargs):
    """The kwargs of arith-tools-v1 (`[env] kwargs`); the tool-use ones are `ToolEnvKwargs`'."""

    levels: Sequence[int] = (1, 2, 3, 4)
    """Difficulty levels to draw from, a non-empty subset of 1..4."""
    python: Literal["auto", "on", "off"] = "auto"
    """The python tool: ``auto`` offers it where the sandbox works, ``on`` requires it,
    ``off`` never offers it."""
    calculator: bool = True
    """Offer the calculator tool (exact arithmetic on integers and fractions)."""
    reward: ArithToolsReward = ArithToolsReward()
    """Terms of the reward (a table; keys left out keep these)."""
    limits: EpisodeLimits = EpisodeLimits(max_turns=6)
    """Per-episode limits (a table); keys left out keep arith-tools-v1's: max_turns = 6 and
    the other defaults."""

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, levels: Sequence[int]) -> tuple[int, ...]:
        return subset_of(levels, (1, 2, 3, 4))


class ArithToolsEnv(ToolEnv):
    """arith-tools-v1 (see the module docstring); built from `ArithToolsKwargs` (or
    keywords validated against it)."""

    env_id = ENV_ID
    Kwargs = ArithToolsKwargs
    kwargs: ArithToolsKwargs
    instructions = (
        "You are a careful math assistant. These numbers are too large to compute in your "
        "head: use the tools. Give the exact integer result in <answer>...</answer>."
    )

    def __init__(self, kwargs: ArithToolsKwargs | None = None, /, **keywords: object) -> None:
        super().__init__(kwargs, **keywords)
        python = self.kwargs.python
        self.levels, self.reward = tuple(self.kwargs.levels), self.kwargs.reward
        self.offer_python = python == "on" or (python == "auto" and sandbox_status()[0])
        self.offer_calculator = self.kwargs.calculator
        if python == "on":
            python_tool()  # raises SandboxUnavailableError now, not mid-episode
        if not (self.offer_python or self.offer_calculator):
            raise ValueError(f"{ENV_ID}: no tools: enable calculator or python")

    def build_tools(self) -> list[Tool]:
        tools = [calculator_tool()] if self.offer_calculator else []
        return tools + ([python_tool()] if self.offer_python else [])

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in DEFAULT_N:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        count = DEFAULT_N[split] if n is None else n
        out = []
        for i in range(count):
            # Different string seeds per split: 12+ digit operands never repeat in practice.
            rng = random.Random(f"{ENV_ID}:{split}:{seed}:{i}")
            level = rng.choice(self.levels)
            question, answer = _problem(rng, level)
            out.append(
                Task(
                    id=f"{ENV_ID}/{split}/{seed}/{i}",
                    prompt=question,
                    answer=str(answer),
                    info={"level": level},
                    env=ENV_ID,
                )
            )
        return out

    def default_grader(self) -> ArithToolsGrader:
        return ArithToolsGrader(self.reward)
