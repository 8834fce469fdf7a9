"""Procedural templates of the code environments: small functions to write, seeded.

Each template (add_n, reverse_words, count_vowels, max_or_default, is_multiple, clamp,
fizzbuzz, ...) draws its constants (the number to add, the words of fizzbuzz, the range
of clamp...) from an rng and returns a `FunctionSpec`: the signature and description shown
to the model, the source of a trusted reference implementation, and a generator of test
inputs. `rldojo.envs.code.tasks` turns specs into tasks (prompt, visible and held-out
tests, split).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TEMPLATES", "FunctionSpec"]

Args = list[Any]


@dataclass(frozen=True)
class FunctionSpec:
    """One function to write: a template with its constants filled in."""

    template: str
    signature: str
    """``name(params) -> type``; the name is the entry point."""
    description: str
    """What it returns, continuing "Write a function `sig` that ..."."""
    reference: str
    """Source of the trusted reference implementation."""
    inputs: Callable[[random.Random], Args]
    """Draws the arguments of one test."""

    @property
    def entry_point(self) -> str:
        return self.signature.split("(", 1)[0]


# --- input generators ------------------------------------------------------------------


def _ints(rng: random.Random, lo: int = -20, hi: int = 20, max_len: int = 6) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, max_len))]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 7)))


def _words(rng: random.Random, sep: str = " ", max_words: int = 5) -> str:
    return sep.join(_word(rng) for _ in range(rng.randint(0, max_words)))


def _text(rng: random.Random, extra: str = "") -> str:
    chars = "abcdefghijklmnopqrstuvwxyz  .,!" + extra
    return "".join(rng.choice(chars) for _ in range(rng.randint(0, 16)))


# --- templates (each draws its constants from rng) ----------------------------------


def _add_n(rng: random.Random) -> FunctionSpec:
    k = rng.choice([*range(-10, 0), *range(1, 31)])
    return FunctionSpec(
        "add_n",
        f"add_n(xs: list[int], n: int = {k}) -> list[int]",
        "returns a new list with `n` added to each element of `xs`",
        f"def add_n(xs, n={k}):\n    return [x + n for x in xs]\n",
        lambda r: [_ints(r)] if r.random() < 0.5 else [_ints(r), r.randint(-9, 9)],
    )


def _reverse(rng: random.Random) -> FunctionSpec:
    mode = rng.choice(["chars", "words", "each_word"])
    if mode == "chars":
        return FunctionSpec(
            "reverse",
            "reverse_string(s: str) -> str",
            "returns `s` reversed",
            "def reverse_string(s):\n    return s[::-1]\n",
            lambda r: [_text(r)],
        )
    sep = rng.choice([" ", ",", ";", "-", "|", "/", ":", "."])
    name, what, body = {
        "words": ("reverse_words", "the order of the words", "parts[::-1]"),
        "each_word": ("reverse_each_word", "each word in place", "[p[::-1] for p in parts]"),
    }[mode]
    return FunctionSpec(
        "reverse",
        f"{name}(s: str) -> str",
        f"returns `s` with {what} reversed; words are separated by {sep!r}",
        f"def {name}(s):\n    parts = s.split({sep!r})\n    return {sep!r}.join({body})\n",
        lambda r: [_words(r, sep)],
    )


def _count_letters(rng: random.Random) -> FunctionSpec:
    if rng.random() < 0.3:
        name, letters, what = "count_vowels", "aeiou", "vowels (a, e, i, o, u)"
    else:
        letters = "".join(sorted(rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(2, 4))))
        name, what = "count_letters", f"characters that are one of {letters!r}"
    return FunctionSpec(
        "count_letters",
        f"{name}(s: str) -> int",
        f"returns the number of {what} in the lowercase string `s`",
        f"def {name}(s):\n    return sum(c in {letters!r} for c in s)\n",
        lambda r: [_text(r, letters * 4)],
    )


def _max_or_default(rng: random.Random) -> FunctionSpec:
    fn, d = rng.choice(["max", "min"]), rng.randint(-10, 10)
    what = "largest" if fn == "max" else "smallest"
    return FunctionSpec(
        "max_or_default",
        f"{fn}_or_default(xs: list[int]) -> int",
        f"returns the {what} element of `xs`, or {d} when `xs` is empty",
        f"def {fn}_or_default(xs):\n    return {fn}(xs) if xs else {d}\n",
        lambda r: [_ints(r, -50, 50)],
    )


def _is_multiple(rng: random.Random) -> FunctionSpec:
    k = rng.randint(2, 20)
    name = "is_even" if k == 2 else "is_multiple"
    return FunctionSpec(
        "is_multiple",
        f"{name}(n: int) -> bool",
        f"returns True when `n` is divisible by {k}, else False",
        f"def {name}(n):\n    return n % {k} == 0\n",
        lambda r: [r.choice([r.randint(-100, 100), k * r.randint(-9, 9)])],
    )


def _clamp(rng: random.Random) -> FunctionSpec:
    lo = rng.randint(-20, 10)
    hi = lo + rng.randint(5, 30)
    return FunctionSpec(
        "clamp",
        "clamp(x: int) -> int",
        f"returns `x` limited to the range [{lo}, {hi}]: {lo} when x < {lo}, {hi} when "
        f"x > {hi}, else x",
        f"def clamp(x):\n    return max({lo}, min({hi}, x))\n",
        lambda r: [r.randint(lo - 15, hi + 15)],
    )


def _fizzbuzz(rng: random.Random) -> FunctionSpec:
    a, b = sorted(rng.sample(range(2, 8), 2))
    wa, wb = rng.sample(["Fizz", "Buzz", "Bang", "Pop", "Zap", "Ding"], 2)
    return FunctionSpec(
        "fizzbuzz",
        "fizzbuzz(n: int) -> str",
        f"returns {wa + wb!r} when `n` is divisible by both {a} and {b}, {wa!r} when it is "
        f"divisible by {a} only, {wb!r} when divisible by {b} only, else str(n)",
        f"def fizzbuzz(n):\n    word = ({wa!r} if n % {a} == 0 else '') + "
        f"({wb!r} if n % {b} == 0 else '')\n    return word or str(n)\n",
        lambda r: [r.choice([r.randint(1, 100), a * r.randint(1, 12), a * b * r.randint(1, 4)])],
    )


def _sum_of_powers(rng: random.Random) -> FunctionSpec:
    p = rng.choice([2, 3])
    which, cond = rng.choice(
        [
            ("", ""),
            ("even ", " if x % 2 == 0"),
            ("odd ", " if x % 2 != 0"),
            ("positive ", " if x > 0"),
        ]
    )
    name = "sum_of_squares" if p == 2 else "sum_of_cubes"
    return FunctionSpec(
        "sum_of_powers",
        f"{name}(xs: list[int]) -> int",
        f"returns the sum of the {'squares' if p == 2 else 'cubes'} of the {which}elements "
        "of `xs` (0 when there are none)",
        f"def {name}(xs):\n    return sum(x ** {p} for x in xs{cond})\n",
        lambda r: [_ints(r, -9, 9)],
    )


def _repeat_chars(rng: random.Random) -> FunctionSpec:
    k = rng.randint(2, 9)
    return FunctionSpec(
        "repeat_chars",
        "repeat_chars(s: str) -> str",
        f"returns `s` with every character repeated {k} times",
        f"def repeat_chars(s):\n    return ''.join(c * {k} for c in s)\n",
        lambda r: [_word(r) if r.random() < 0.8 else ""],
    )


def _count_above(rng: random.Random) -> FunctionSpec:
    t, above = rng.randint(-10, 20), rng.random() < 0.5
    name, op, what = ("count_above", ">", "greater") if above else ("count_below", "<", "less")
    return FunctionSpec(
        "count_above",
        f"{name}(xs: list[int]) -> int",
        f"returns how many elements of `xs` are strictly {what} than {t}",
        f"def {name}(xs):\n    return sum(1 for x in xs if x {op} {t})\n",
        lambda r: [_ints(r, t - 10, t + 10, 8)],
    )


def _caesar(rng: random.Random) -> FunctionSpec:
    k = rng.randint(1, 25)
    return FunctionSpec(
        "caesar",
        "caesar(s: str) -> str",
        f"returns `s` with every lowercase letter shifted {k} places forward in the "
        "alphabet, wrapping around from 'z' to 'a'; other characters stay as they are",
        "def caesar(s):\n    return ''.join(chr((ord(c) - 97 + "
        f"{k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)\n",
        lambda r: [_text(r)],
    )


def _digit_sum(rng: random.Random) -> FunctionSpec:
    b = rng.randint(2, 10)
    return FunctionSpec(
        "digit_sum",
        "digit_sum(n: int) -> int",
        f"returns the sum of the digits of the non-negative integer `n` written in base {b}",
        f"def digit_sum(n):\n    total = 0\n    while n:\n        n, d = divmod(n, {b})\n"
        "        total += d\n    return total\n",
        lambda r: [r.choice([r.randint(0, 20), r.randint(0, 10_000)])],
    )


def _sequence_term(rng: random.Random) -> FunctionSpec:
    a, b = rng.randint(0, 5), rng.randint(1, 5)
    return FunctionSpec(
        "sequence_term",
        "sequence_term(n: int) -> int",
        f"returns t(n) for n >= 0, where t(0) = {a}, t(1) = {b} and t(i) = t(i - 1) + t(i - 2)",
        f"def sequence_term(n):\n    x, y = {a}, {b}\n    for _ in range(n):\n"
        "        x, y = y, x + y\n    return x\n",
        lambda r: [r.randint(0, 25)],
    )


def _filter_words(rng: random.Random) -> FunctionSpec:
    k, longer, sep = rng.randint(1, 6), rng.random() < 0.5, rng.choice([" ", ",", ";"])
    name, op, what = ("long_words", ">", "longer") if longer else ("short_words", "<", "shorter")
    return FunctionSpec(
        "filter_words",
        f"{name}(s: str) -> list[str]",
        f"returns the words of `s` (separated by {sep!r}) that are {what} than {k} "
        "characters, in order",
        f"def {name}(s):\n    return [w for w in s.split({sep!r}) if w and len(w) {op} {k}]\n",
        lambda r: [_words(r, sep, 7)],
    )


def _running_total(rng: random.Random) -> FunctionSpec:
    s0 = rng.randint(-5, 10)
    return FunctionSpec(
        "running_total",
        "running_total(xs: list[int]) -> list[int]",
        f"returns the running totals of `xs` starting from {s0}: element i is {s0} plus "
        "the sum of xs[0] to xs[i]",
        f"def running_total(xs):\n    out, total = [], {s0}\n    for x in xs:\n"
        "        total += x\n        out.append(total)\n    return out\n",
        lambda r: [_ints(r)],
    )


TEMPLATES: dict[str, Callable[[random.Random], FunctionSpec]] = {
    "add_n": _add_n,
    "reverse": _reverse,
    "count_letters": _count_letters,
    "max_or_default": _max_or_default,
    "is_multiple": _is_multiple,
    "clamp": _clamp,
    "fizzbuzz": _fizzbuzz,
    "sum_of_powers": _sum_of_powers,
    "repeat_chars": _repeat_chars,
    "count_above": _count_above,
    "caesar": _caesar,
    "digit_sum": _digit_sum,
    "sequence_term": _sequence_term,
    "filter_words": _filter_words,
    "running_total": _running_total,
}
"""Procedural templates by name; each draws a `FunctionSpec` from an rng."""
