"""Environment kwargs declared as pydantic models, checked before the factory runs.

An environment family declares what its factory accepts as a model, one documented field
per keyword argument, and puts it on the factory as `Kwargs`:

    class ReverseKwargs(EnvKwargs):
        words: int = Field(3, ge=1)
        \"\"\"Words per sentence to reverse.\"\"\"

    class ReverseEnv(SingleTurnEnv):
        Kwargs = ReverseKwargs
        def __init__(self, words: int = 3) -> None: ...

The registry validates `env.kwargs` against it (`validate_kwargs`) before calling the
factory, so a typo or a wrong type is one line naming the TOML key, the environment and
what was expected (``env.kwargs.db_size: crm-v1: expected 'small', 'default' or 'large',
got 'huge'``), and `rldojo envs --kwargs ID` lists the fields (`kwargs_rows`; the
`limits.*` rows show the environment's own limits, its `default_limits`, which a partial
table keeps). The model only checks: the factory receives the kwargs as given and keeps
its own checks of how values combine. Validation is strict (no ``"3"`` for 3), as TOML
and JSON give real types. A factory without a model is checked against its signature instead.

A class's `Kwargs` describes the `__init__` of the class that declares it, so a subclass
with its own `__init__` and no `Kwargs` of its own falls back to its signature.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticUndefined

__all__ = [
    "EnvKwargs",
    "EnvKwargsError",
    "KwargRow",
    "LimitsKwargs",
    "ToolEnvKwargs",
    "kwargs_model",
    "kwargs_rows",
    "validate_kwargs",
]


class EnvKwargsError(ValueError):
    """`env.kwargs` do not fit the environment's factory (message: one line, naming the key)."""


class EnvKwargs(BaseModel):
    """Base of the kwargs models: unknown keys refused, strict types, field docstrings kept."""

    model_config = ConfigDict(
        extra="forbid", strict=True, use_attribute_docstrings=True, from_attributes=True
    )


class LimitsKwargs(EnvKwargs):
    """`rldojo.envs.multiturn.EpisodeLimits` as a table: ``limits = {max_turns = 6}``. The
    keys left out keep the environment's own values (its `default_limits`), not these."""

    max_turns: int = Field(8, gt=0)
    """Policy turns before the episode is cut (`episode/limit` = turns)."""
    max_tokens: int = Field(16_384, gt=0)
    """Approximate tokens of policy and environment text before the episode is cut."""
    max_wall_s: float = Field(300.0, gt=0)
    """Seconds spent inside `step` before the episode is cut."""


class ToolEnvKwargs(EnvKwargs):
    """The keyword arguments every `rldojo.envs.multiturn.ToolEnv` takes."""

    limits: LimitsKwargs | None = None
    """Per-episode limits (a table); keys left out keep the environment's own."""
    schema_style: Literal["json", "signatures", "template"] = "json"
    """How tools are listed in the system prompt: one JSON schema per line, one short
    signature per tool, or not at all (the chat template renders them)."""
    max_calls_per_turn: int = Field(8, gt=0)
    """Tool calls beyond this in one turn are refused (`too_many_calls`)."""
    tool_timeout_s: float = Field(30.0, gt=0)
    """Time limit of one tool call, in seconds."""
    no_action: Literal["nudge", "end"] = "nudge"
    """A turn with neither a tool call nor an answer gets a reminder, or ends the episode."""
    max_result_chars: int = Field(4000, gt=0)
    """Longer tool results are cut (the model is told they were)."""


def kwargs_model(factory: Callable[..., Any]) -> type[BaseModel] | None:
    """The `Kwargs` model of `factory`, or None (see the module docstring for classes)."""
    model: Any = None
    if isinstance(factory, type):
        for cls in factory.__mro__:
            if "Kwargs" in vars(cls) or "__init__" in vars(cls):
                model = vars(cls).get("Kwargs")
                break
    else:
        model = getattr(factory, "Kwargs", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def validate_kwargs(env_id: str, model: type[BaseModel], kwargs: Mapping[str, Any]) -> None:
    """`EnvKwargsError` (one line, the first problem) when `kwargs` do not fit `model`."""
    try:
        model.model_validate(dict(kwargs))
    except ValidationError as exc:
        raise EnvKwargsError(_first_problem(env_id, model, exc)) from None


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (``LimitsKwargs | None`` -> LimitsKwargs), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _nested(a)) is not None), None)


_TYPE_TAGS = {"str", "int", "float", "bool", "none"}


def _key(model: type[BaseModel], loc: tuple[Any, ...], extra: bool) -> tuple[Any, ...]:
    """`loc` without pydantic's union-member tags: the path a user wrote."""
    out: list[Any] = []
    current: type[BaseModel] | None = model
    for i, part in enumerate(loc):
        if isinstance(part, int) or (extra and i == len(loc) - 1):
            out.append(part)
        elif current is not None:
            if part in current.model_fields:
                out.append(part)
                current = _nested(current.model_fields[part].annotation)
        elif isinstance(part, str) and part.isidentifier() and part not in _TYPE_TAGS:
            out.append(part)  # a key of a mapping
    return tuple(out)


def _owner(model: type[BaseModel], key: tuple[Any, ...]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in key:
        if current is None or part not in current.model_fields:
            return None
        current = _nested(current.model_fields[part].annotation)
    return current


def _first_problem(env_id: str, model: type[BaseModel], exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    extra = first["type"] == "extra_forbidden"
    key = _key(model, tuple(first["loc"]), extra)
    name = "env.kwargs" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in key)
    if extra:
        owner = _owner(model, key[:-1])
        accepted = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(key[-1]), accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        where = env_id if len(key) == 1 else f"{env_id}'s {'.'.join(map(str, key[:-1]))}"
        return (
            f"{name}: {where} takes no argument {key[-1]!r}{hint}; "
            f"it takes: {', '.join(accepted) or '(none)'}"
        )
    if first["type"] == "missing":
        return f"{name}: {env_id}: missing (required)"
    same = [e for e in errors if _key(model, tuple(e["loc"]), False) == key]
    expected = " or ".join(dict.fromkeys(_expected(e["msg"]) for e in same))
    got = repr(first.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    return " ".join(f"{name}: {env_id}: {expected}, got {got}".split())


def _expected(msg: str) -> str:
    if msg.startswith("Input should be "):
        what = msg.removeprefix("Input should be ")
        return "expected " + ("a value " if what.startswith(("greater", "less")) else "") + what
    msg = msg.removeprefix("Value error, ")
    return msg[:1].lower() + msg[1:]


# ------------------------------------------------------------------ describing the kwargs


@dataclass(frozen=True)
class KwargRow:
    """One keyword argument as `rldojo envs --kwargs` shows it."""

    name: str
    type: str
    default: str
    doc: str


def kwargs_rows(factory: Callable[..., Any]) -> tuple[list[KwargRow], bool]:
    """`(rows, from the model)`: the factory's kwargs from its `Kwargs` model (nested
    tables flattened, ``limits.max_turns``), else from its signature (no docs)."""
    model = kwargs_model(factory)
    if model is not None:
        return _model_rows(model, "", _own_tables(factory)), True
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return [], False
    rows = [
        KwargRow(
            p.name,
            "" if p.annotation is p.empty else _type_name(p.annotation),
            "required" if p.default is p.empty else _show(p.default),
            "",
        )
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return rows, False


def _own_tables(factory: Callable[..., Any]) -> dict[str, dict[str, Any]]:
    """Defaults of nested tables that the factory holds itself, by field name: a
    multi-turn environment's `limits` are its `default_limits` (a partial table is merged
    over them, `rldojo.envs.multiturn.MultiTurnEnv`), not `LimitsKwargs`' own."""
    limits = getattr(factory, "default_limits", None) if isinstance(factory, type) else None
    if dataclasses.is_dataclass(limits) and not isinstance(limits, type):
        return {"limits": dataclasses.asdict(limits)}
    return {}


def _model_rows(
    model: type[BaseModel], prefix: str, tables: Mapping[str, Mapping[str, Any]] | None = None
) -> list[KwargRow]:
    """The model's own fields first (in order), then those of its bases; a nested table's
    rows show `tables[name]`'s values where given (`_own_tables`)."""
    own = [n for n in model.model_fields if n in vars(model).get("__annotations__", {})]
    rows = []
    values = tables.get(prefix.rstrip("."), {}) if tables and prefix else {}
    for name in own + [n for n in model.model_fields if n not in own]:
        info = model.model_fields[name]
        if name in values:
            default = _show(values[name])
        elif info.default is not PydanticUndefined:
            default = _show(info.default)
        elif info.default_factory is not None:
            default = _show(info.default_factory())  # type: ignore[call-arg]
        else:
            default = "required"
        doc = " ".join((info.description or "").split())
        rows.append(KwargRow(prefix + name, _type_name(info.annotation), default, doc))
        nested = _nested(info.annotation)
        if nested is not None:
            rows += _model_rows(nested, f"{prefix}{name}.", tables)
    return rows


_QUALIFIER = re.compile(r"(?<![\w'\"])(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")


def _type_name(annotation: Any) -> str:
    nested = _nested(annotation)
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = _QUALIFIER.sub("", text)
    return text.replace(nested.__name__, "table") if nested is not None else text


def _show(value: Any) -> str:
    if value is None:
        return "None"
    try:
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    except TypeError:
        return repr(value)
