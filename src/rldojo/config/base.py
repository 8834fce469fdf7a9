"""The base of every config section, and the one error type of bad configuration."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config file or override is invalid; the message is one line naming file and key."""


class _Section(BaseModel):
    # strict: `lr = "1e-5"` (a string) or `steps = 2.0` is an error, not silently coerced;
    # an integer is still a valid float, and a TOML array a valid tuple.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
