"""The base of every config section, the error types of bad configuration, and the one
place a pydantic validation error becomes the one-line `file: key: message`.

TOML has no null: a key whose type admits None takes the string `"none"` (any case) for
None, in a file or `--set key=none`, so a key whose default is not None can be turned off
(`loss.tis_cap = "none"`); `dump_config` writes such a None the same way."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from rldojo.config.stages import MOVED, is_stage


class ConfigError(ValueError):
    """A config file or override is invalid; the message is one line naming file and key."""


class ConfigValueError(ValueError):
    """A config value that the model, data or environment it meets rejects, found after
    the file was read (e.g. `model.lora.layers` the model does not have). The message is
    one line naming the key; the command that read the config puts its file in front
    (`rldojo.commands.ui.user_errors`), which it cannot do for a `ConfigError`."""


class _Section(BaseModel):
    # strict: `lr = "1e-5"` (a string) or `steps = 2.0` is an error, not silently coerced;
    # an integer is still a valid float, and a TOML array a valid tuple.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _none_from_text(cls, data: Any) -> Any:
        """`"none"` (any case) is None for a key whose type admits None; for any other
        key it stays the string (which a type other than `str` rejects, in one line)."""
        if not isinstance(data, dict):
            return data
        return {
            key: None if _is_none_text(value) and admits_none(cls, key) else value
            for key, value in data.items()
        }


NONE_TEXT = "none"
"""How a config file spells None (TOML has none): any case of it, for a key admitting None."""


def _is_none_text(value: Any) -> bool:
    return isinstance(value, str) and value.lower() == NONE_TEXT


def admits_none(model: type[BaseModel], key: Any) -> bool:
    """Whether field `key` of `model` may be None (`X | None`, `Optional[X]`, `Any`)."""
    field = model.model_fields.get(key) if isinstance(key, str) else None
    if field is None:
        return False
    annotation = field.annotation
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def toml_data(model: BaseModel, *, only_given: bool = False) -> dict[str, Any]:
    """`model`'s values as TOML data (for `dump_config`): its sections, and arrays of
    them, as tables; a None as `"none"` where the key's default is not None (so it reads
    back as None, not as the default), else left out. `only_given`: the keys given to it
    alone (an objective's table of a shared section, `rldojo.config.stages`), a None as
    `"none"`."""
    dumped = model.model_dump(mode="json")
    out: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        if only_given and name not in model.model_fields_set:
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel) and is_stage(type(model), name):
            out[name] = toml_data(value, only_given=True)  # an objective's keys
        elif isinstance(value, BaseModel):
            out[name] = toml_data(value)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            out[name] = [toml_data(item) for item in value]
        elif value is None:
            if only_given or field.get_default(call_default_factory=True) is not None:
                out[name] = NONE_TEXT
        else:
            out[name] = _drop_none(dumped[name])
    return out


def _drop_none(value: Any) -> Any:
    """A plain value (a table or array of a key) without its None items."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value if v is not None]
    return value


def format_error(source: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """`source: key: message` for the first error of validating `root`; an unknown key
    names the closest key of its section, e.g.
    `my.toml: rollout.group_sise: unknown key (did you mean group_size?)`."""
    return f"{source}: {describe_error(exc, root)}"


def describe_error(exc: ValidationError, root: type[BaseModel]) -> str:
    """`key: message` for the first error of validating `root` (`format_error` without
    its source)."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden" and where in MOVED:
        msg = f"moved to {MOVED[where]}"
    elif err["type"] == "extra_forbidden":
        msg = "unknown key" + _did_you_mean(root, err["loc"])
    elif _is_none_text(err.get("input")):
        msg += f" ({err['input']!r} is None only for a key whose type admits None)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {msg}{more}"


def _did_you_mean(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    section = _model_at(root, loc[:-1])
    if section is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(section.model_fields), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _model_at(annotation: Any, path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The section model that `path` (an error's location) leads to from `annotation`,
    through optional sections and lists of them; None where it leads to no model."""
    for part in path:
        annotation = _section_of(annotation)
        if annotation is None:
            return None
        if isinstance(part, int):
            continue  # an item of a list: `_section_of` already looked inside it
        field = annotation.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
    return _section_of(annotation)


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The model in `X`, `X | None` or `list[X]`; None for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        found = [m for m in map(_section_of, typing.get_args(annotation)) if m is not None]
        return found[0] if len(found) == 1 else None
    return None
