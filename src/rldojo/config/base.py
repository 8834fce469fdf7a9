"""The base of every config section, the error types of bad configuration, and the one
place a pydantic validation error becomes the one-line `file: key: message`."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


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


def format_error(source: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """`source: key: message` for the first error of validating `root`; an unknown key
    names the closest key of its section, e.g.
    `my.toml: rollout.group_sise: unknown key (did you mean group_size?)`."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key" + _did_you_mean(root, err["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{source}: {where}: {msg}{more}"


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
