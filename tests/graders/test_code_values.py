"""Type-tagged values and strict comparison (pure functions, no sandbox)."""

from __future__ import annotations

import math

import pytest

from rldojo.graders.code.values import Unsupported, decode, encode, strict_equal


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(10**30), 1.5, math.inf, "héllo", b"\x00\xff", 2 + 3j,
     [1, [2, (3, "x")]], (), {1, 2}, frozenset({"a"}), {"k": [1.0, None], 3: (True,)}],
)  # fmt: skip
def test_round_trip(value: object) -> None:
    back = decode(encode(value))
    assert strict_equal(back, value)
    assert type(back) is type(value)


def test_nan_round_trip_and_equality() -> None:
    assert strict_equal(decode(encode(math.nan)), math.nan)


@pytest.mark.parametrize(
    ("a", "b"),
    [(1, True), (1, 1.0), ([1], (1,)), ({1}, frozenset({1})), ("1", 1), ({1: 2}, {1: 2.0})],
)
def test_strict_equality_distinguishes_types(a: object, b: object) -> None:
    assert not strict_equal(a, b)


def test_floats_compare_by_value() -> None:
    assert strict_equal(-0.0, 0.0)
    assert strict_equal([0.1 + 0.2], [0.30000000000000004])


def test_subclasses_and_custom_types_do_not_cross() -> None:
    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    class Plain:
        pass

    liar = decode(encode(Liar(3)))
    assert isinstance(liar, Unsupported) and liar.eq_override
    plain = decode(encode([Plain()]))[0]
    assert isinstance(plain, Unsupported) and not plain.eq_override
    assert not strict_equal(liar, 3) and not strict_equal(liar, liar)


def test_self_referencing_values_stop_at_depth() -> None:
    loop: list = []
    loop.append(loop)
    tree = encode(loop)
    value = decode(tree)
    assert isinstance(value, list)


@pytest.mark.parametrize(
    "tree",
    [[], ["int"], ["int", 5], ["int", "9" * 5000], ["list", "x"], ["dict", [["int", "1"]]],
     ["set", [["list", []]]], ["bogus", 1], "str", ["float", None]],
)  # fmt: skip
def test_malformed_trees_raise_value_error(tree: object) -> None:
    with pytest.raises(ValueError):
        decode(tree)
