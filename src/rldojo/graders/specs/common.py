"""The bottom of grader-spec loading: `GraderSpecError` and the field checks every builder uses.

Builders (`openai_text`, `openai_models`, `openai_python`, `rldojo_types`) and the shared
`context` import these; nothing here imports another spec module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rldojo.config import ConfigError

__all__ = ["GraderSpecError", "check_keys", "require"]


class GraderSpecError(ConfigError):
    """A grader spec is malformed; the message names the field."""


def check_keys(spec: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    """GraderSpecError for a key outside `allowed` (typos must not be ignored)."""
    for key in spec:
        if key not in allowed:
            raise GraderSpecError(f"{path}.{key}: unknown key (allowed: {', '.join(allowed)})")


def require(spec: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    """`spec[key]`, which must be present and of `kind`."""
    if key not in spec:
        raise GraderSpecError(f"{path}.{key}: missing")
    value = spec[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        names = "/".join(k.__name__ for k in _kinds(kind))
        raise GraderSpecError(f"{path}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
