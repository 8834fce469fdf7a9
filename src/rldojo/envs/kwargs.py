"""Environment kwargs declared once, as pydantic models, and the environments built from them.

An environment family declares what it accepts as a model, one documented field per
keyword argument (its type, default, limits and docstring), puts it on the class as
`Kwargs`, and is built from the validated model:

    class ReverseKwargs(EnvKwargs):
        words: int = Field(3, ge=1)
        \"\"\"Words per sentence to reverse.\"\"\"

    class ReverseEnv(SingleTurnEnv):
        Kwargs = ReverseKwargs
        def __init__(self, kwargs: ReverseKwargs | None = None, /, **keywords: object):
            super().__init__()
            self.kwargs = given_kwargs(self.env_id, ReverseKwargs, kwargs, keywords)

The registry validates `env.kwargs` against the model (`validate_kwargs`), so a typo or a
wrong type is one line naming the TOML key, the environment and what was expected
(``env.kwargs.db_size: crm-v1: expected 'small', 'default' or 'large', got 'huge'``), and
passes the validated model to a factory whose first parameter is annotated with it
(`takes_model`); a Python caller may pass keywords instead (``ReverseEnv(words=4)``),
validated against the same model (`given_kwargs`). `rldojo envs --kwargs ID` lists the
fields (`kwargs_rows`). Validation is strict (no ``"3"`` for 3), as TOML and JSON give
real types. Graders read the same models (crm-v1's `CrmReward` is the ``reward`` table).

A multi-turn environment's limits are the default of its model's `limits` field
(`MultiTurnKwargs`); a partial table is merged over them (``limits = {max_wall_s = 200}``
keeps the environment's own `max_turns`). A factory with a model but plain keyword
arguments (``def __init__(self, words: int = 3)``) gets the keywords as written, after the
model checked them; a factory without a model is checked against its signature.

A class's `Kwargs` describes the `__init__` of the class that declares it, so a subclass
with its own `__init__` and no `Kwargs` of its own falls back to its signature.
"""

from __future__ import annotations

import difflib
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticUndefined

__all__ = [
    "EnvKwargs",
    "EnvKwargsError",
    "EpisodeLimits",
    "KwargRow",
    "MultiTurnKwargs",
    "ToolEnvKwargs",
    "given_kwargs",
    "kwargs_model",
    "kwargs_rows",
    "subset_of",
    "takes_model",
    "validate_kwargs",
]

M = TypeVar("M", bound=BaseModel)


class EnvKwargsError(ValueError):
    """`env.kwargs` do not fit the environment's factory (message: one line, naming the key)."""


class EnvKwargs(BaseModel):
    """Base of the kwargs models: unknown keys refused, strict types, field docstrings kept,
    immutable (an environment and its forks share theirs)."""

    model_config = ConfigDict(
        extra="forbid", strict=True, use_attribute_docstrings=True, frozen=True
    )


class EpisodeLimits(EnvKwargs):
    """Per-episode limits; whichever is hit first ends the episode (`episode/limit`). As a
    table, ``limits = {max_turns = 6}``: the keys left out keep the environment's own."""

    max_turns: int = Field(8, gt=0)
    """Policy turns before the episode is cut (`episode/limit` = turns)."""
    max_tokens: int = Field(16_384, gt=0)
    """Approximate tokens of policy and environment text before the episode is cut."""
    max_wall_s: float = Field(300.0, gt=0)
    """Seconds spent inside `step` before the episode is cut (time between steps, e.g.
    sampling, is not counted)."""


class MultiTurnKwargs(EnvKwargs):
    """The keyword arguments every `rldojo.envs.multiturn.MultiTurnEnv` takes. A family
    declares its own limits as the default of `limits`."""

    limits: EpisodeLimits = EpisodeLimits()
    """Per-episode limits (a table); keys left out keep the environment's own."""

    @field_validator("limits", mode="before")
    @classmethod
    def _over_own_limits(cls, value: object) -> object:
        """A table is merged over this model's default limits (the environment's own);
        None keeps them; an `EpisodeLimits` replaces them."""
        own = cls.model_fields["limits"].default
        if value is None:
            return own
        if isinstance(value, Mapping) and isinstance(own, EpisodeLimits):
            return {**own.model_dump(), **value}
        return value


class ToolEnvKwargs(MultiTurnKwargs):
    """The keyword arguments every `rldojo.envs.multiturn.ToolEnv` takes."""

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


def subset_of(levels: Sequence[int], known: Sequence[int]) -> tuple[int, ...]:
    """`levels` as a tuple; ValueError unless they are a non-empty subset of `known`."""
    if not levels or any(x not in known for x in levels):
        raise ValueError(f"levels must be a non-empty subset of {tuple(known)}")
    return tuple(levels)


def kwargs_model(factory: Callable[..., object]) -> type[BaseModel] | None:
    """The `Kwargs` model of `factory`, or None (see the module docstring for classes)."""
    model: object = None
    if isinstance(factory, type):
        for cls in factory.__mro__:
            if "Kwargs" in vars(cls) or "__init__" in vars(cls):
                model = vars(cls).get("Kwargs")
                break
    else:
        model = getattr(factory, "Kwargs", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def takes_model(factory: Callable[..., object], model: type[BaseModel]) -> bool:
    """Whether `factory` is built from the validated `model`: its first parameter is
    annotated with it, or a base of it (``def __init__(self, kwargs: CrmKwargs | None =
    None, /, ...)``). Otherwise it takes keyword arguments, as written."""
    try:
        first = next(iter(inspect.signature(factory).parameters.values()), None)
        target = factory
        if isinstance(factory, type):  # the __init__ it runs (its own or inherited)
            target = next(vars(c)["__init__"] for c in factory.__mro__ if "__init__" in vars(c))
        hint = typing.get_type_hints(target).get(first.name) if first is not None else None
    except Exception:  # an annotation that does not resolve: keywords, as before
        return False
    hints = (hint, *get_args(hint))
    return any(
        isinstance(h, type) and issubclass(h, BaseModel) and issubclass(model, h) for h in hints
    )


def validate_kwargs(env_id: str, model: type[M], kwargs: Mapping[str, object]) -> M:
    """`kwargs` validated against `model`; `EnvKwargsError` (one line, the first problem)
    when they do not fit."""
    try:
        return model.model_validate(dict(kwargs))
    except ValidationError as exc:
        raise EnvKwargsError(_first_problem(env_id, model, exc)) from None


def given_kwargs(
    env_id: str, model: type[M], kwargs: M | None, keywords: Mapping[str, object]
) -> M:
    """An environment's kwargs: the validated `kwargs` the registry passes, or a Python
    caller's `keywords` (``CrmEnv(levels=[1])``) validated against the same `model`."""
    if kwargs is None:
        return validate_kwargs(env_id, model, keywords)
    if not isinstance(kwargs, model) or keywords:
        given = type(kwargs).__name__ + (" and keywords" if keywords else "")
        raise TypeError(f"{env_id}: takes a {model.__name__} or keywords, got {given}")
    return kwargs


def _nested(annotation: object) -> type[BaseModel] | None:
    """The model a field holds (``EpisodeLimits | None`` -> EpisodeLimits), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _nested(a)) is not None), None)


_TYPE_TAGS = {"str", "int", "float", "bool", "none"}

Loc = tuple[int | str, ...]
"""Where a validation error is: field names, list indices and mapping keys."""


def _key(model: type[BaseModel], loc: Loc, extra: bool) -> Loc:
    """`loc` without pydantic's union-member tags: the path a user wrote."""
    out: list[int | str] = []
    current: type[BaseModel] | None = model
    for i, part in enumerate(loc):
        if isinstance(part, int) or (extra and i == len(loc) - 1):
            out.append(part)
        elif current is not None:
            if part in current.model_fields:
                out.append(part)
                current = _nested(current.model_fields[part].annotation)
        elif part.isidentifier() and part not in _TYPE_TAGS:
            out.append(part)  # a key of a mapping
    return tuple(out)


def _owner(model: type[BaseModel], key: Loc) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in key:
        if current is None or part not in current.model_fields:
            return None
        current = _nested(current.model_fields[str(part)].annotation)
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
    if not key:  # a rule across fields (a model validator): the message says it all
        return " ".join(f"{name}: {env_id}: {expected.removeprefix(env_id + ': ')}".split())
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


def kwargs_rows(factory: Callable[..., object]) -> tuple[list[KwargRow], bool]:
    """`(rows, from the model)`: the factory's kwargs from its `Kwargs` model (nested
    tables flattened, ``limits.max_turns``, with the values of the table's default: the
    environment's own limits), else from its signature (no docs)."""
    model = kwargs_model(factory)
    if model is not None:
        return _model_rows(model, "", None), True
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


def _model_rows(model: type[BaseModel], prefix: str, values: BaseModel | None) -> list[KwargRow]:
    """The model's own fields first (in order), then those of its bases; a nested table's
    rows show the values of `values`, its parent's default, where it has one."""
    own = [n for n in vars(model).get("__annotations__", {}) if n in model.model_fields]
    rows = []
    for name in own + [n for n in model.model_fields if n not in own]:
        info = model.model_fields[name]
        default: object = PydanticUndefined
        if values is not None:
            default = getattr(values, name)
        elif info.default is not PydanticUndefined:
            default = info.default
        elif info.default_factory is not None:
            default = info.default_factory()  # type: ignore[call-arg]
        nested = _nested(info.annotation)
        table = nested is not None and isinstance(default, BaseModel)
        shown = "required" if default is PydanticUndefined else "" if table else _show(default)
        doc = " ".join((info.description or "").split())
        rows.append(KwargRow(prefix + name, _type_name(info.annotation), shown, doc))
        if nested is not None:
            below = default if isinstance(default, BaseModel) else None
            rows += _model_rows(nested, f"{prefix}{name}.", below)
    return rows


_QUALIFIER = re.compile(r"(?<![\w'\"])(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")


def _type_name(annotation: object) -> str:
    nested = _nested(annotation)
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = _QUALIFIER.sub("", text)
    return text.replace(nested.__name__, "table") if nested is not None else text


def _show(value: object) -> str:
    if value is None:
        return "None"
    try:
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    except TypeError:
        return repr(value)
