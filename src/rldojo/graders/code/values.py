"""Type-tagged values that cross the sandbox boundary, and type-strict comparison.

Test inputs go into the sandbox and candidate return values come out as JSON trees of
``[tag, payload]`` pairs built from *exact* builtin types only (``type(v) is int``, never
``isinstance``), so nothing executable or lying crosses: an ``int`` subclass with an
always-true ``__eq__`` arrives as ``["unsupported", {"type": ..., "eq_override": true}]``
and fails, with the information needed for the ``hack:eq_override`` flag.

Stdlib only and no rldojo imports: this file is also shipped into the sandbox (as
``/rldojo/code_values.py``) where the trusted driver and its test processes use it.
"""

import math

MAX_DEPTH = 100
_BUILTIN_BASES = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)


class Unsupported:
    """A returned value of a type that may not cross (custom class, subclass, too deep)."""

    __slots__ = ("eq_override", "reason", "type_name")

    def __init__(self, type_name, eq_override=False, reason=""):
        self.type_name = type_name
        self.eq_override = eq_override
        self.reason = reason

    def __repr__(self):
        return f"Unsupported({self.type_name!r}, eq_override={self.eq_override!r})"


def _describe(value):
    """What we may learn about an unsupported value without trusting it."""
    cls = type(value)
    try:
        name = f"{cls.__module__}.{cls.__qualname__}"
    except Exception:
        name = "?"
    try:
        override = any(
            "__eq__" in vars(k) or "__ne__" in vars(k) or "__hash__" in vars(k)
            for k in cls.__mro__
            if k not in (object, *_BUILTIN_BASES)
        )
    except Exception:
        override = True
    return {"type": name, "eq_override": bool(override)}


def encode(value, depth=0):
    """A JSON-able tagged tree of `value` (exact builtin types only)."""
    if depth > MAX_DEPTH:
        return ["unsupported", {"type": "?", "eq_override": False, "reason": "too deep"}]
    t = type(value)
    if value is None:
        return ["none"]
    if t is bool:
        return ["bool", value]
    if t is int:
        try:
            return ["int", str(value)]
        except ValueError:  # more digits than int->str allows
            return ["unsupported", {"type": "int", "eq_override": False, "reason": "too large"}]
    if t is float:
        return ["float", repr(value)]
    if t is complex:
        return ["complex", repr(value.real), repr(value.imag)]
    if t is str:
        return ["str", value]
    if t is bytes:
        return ["bytes", value.hex()]
    if t is list or t is tuple or t is set or t is frozenset:
        return [t.__name__, [encode(v, depth + 1) for v in value]]
    if t is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    return ["unsupported", _describe(value)]


def _seq(payload, depth):
    if type(payload) is not list:
        raise ValueError("malformed container")
    return [decode(v, depth + 1) for v in payload]


def decode(tree, depth=0):
    """The Python value of a tagged tree; ValueError on anything malformed."""
    if depth > MAX_DEPTH + 1 or type(tree) is not list or not tree or type(tree[0]) is not str:
        raise ValueError("malformed value")
    tag, rest = tree[0], tree[1:]
    if tag == "none" and not rest:
        return None
    if len(rest) == 1 and tag in ("bool", "int", "float", "str", "bytes"):
        raw = rest[0]
        if tag == "bool" and type(raw) is bool:
            return raw
        if tag == "str" and type(raw) is str:
            return raw
        if tag == "int" and type(raw) is str and len(raw) <= 4300:
            return int(raw)
        if tag == "float" and type(raw) is str:
            return float(raw)
        if tag == "bytes" and type(raw) is str:
            return bytes.fromhex(raw)
    if tag == "complex" and len(rest) == 2 and all(type(r) is str for r in rest):
        return complex(float(rest[0]), float(rest[1]))
    try:
        if len(rest) == 1 and tag in ("list", "tuple", "set", "frozenset"):
            items = _seq(rest[0], depth)
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict" and len(rest) == 1 and type(rest[0]) is list:
            pairs = [_seq(p, depth) for p in rest[0]]
            if any(len(p) != 2 for p in pairs):
                raise ValueError("malformed dict")
            return {k: v for k, v in pairs}
    except TypeError as exc:  # an unhashable set member or dict key
        raise ValueError(f"malformed container: {exc}") from None
    if tag == "unsupported" and len(rest) == 1 and type(rest[0]) is dict:
        info = rest[0]
        return Unsupported(
            str(info.get("type", "?"))[:200],
            info.get("eq_override") is True,
            str(info.get("reason", ""))[:200],
        )
    raise ValueError(f"malformed value with tag {tag!r}")


def canonical(value):
    """A hashable key that is equal for two values iff they are strictly equal.

    Types must match exactly at every level (``True`` is not ``1``, ``1`` is not ``1.0``,
    a list is not a tuple); floats compare by value (``-0.0 == 0.0``) and NaN equals NaN.
    """
    t = type(value)
    if t is float:
        return ("float", "nan" if math.isnan(value) else value)
    if t in (list, tuple):
        return (t.__name__, tuple(canonical(v) for v in value))
    if t in (set, frozenset):
        return (t.__name__, frozenset(canonical(v) for v in value))
    if t is dict:
        return ("dict", frozenset((canonical(k), canonical(v)) for k, v in value.items()))
    if t is complex:
        return ("complex", canonical(value.real), canonical(value.imag))
    if t is Unsupported:
        return ("unsupported", object())  # never equal to anything, itself included
    return (t.__name__, value)


def strict_equal(a, b):
    """Type-strict equality of two decoded values (see `canonical`)."""
    try:
        return canonical(a) == canonical(b)
    except TypeError:  # an unhashable inside a set/dict key cannot come from decode
        return False
