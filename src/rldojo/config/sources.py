"""Where a config value came from, for an error about it: the file, `--set`, or the defaults.

An error about a value names its key first (`env.id: unknown environment ...`); `blame`
puts its source in front: `--set env.id: ...` when an override gave the key (or a table
above or below it), else `my.toml: env.id: ...`, else `defaults: ...`. `load_config`'s
errors and the commands' (an environment id or kwargs the registry rejects, a model the
loader cannot find) are named this way, so a value typed after `--set` is never blamed on
a file or the defaults.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["blame", "value_source"]

_KEY = re.compile(r"([a-z_][a-z0-9_]*(?:\.[A-Za-z0-9_-]+|\[\d+\])*): ")
"""The key an error about a config value starts with: `env.id: `, `env.mix.0.kwarg: `."""


def _parts(key: str) -> list[str]:
    return key.replace("[", ".").replace("]", "").split(".")


def value_source(key: str | None, path: str | Path | None, overrides: Sequence[str] = ()) -> str:
    """Where the value of `key` came from: "--set" when an override set it (or a table
    above or below it), else the config file, else "defaults". Without a key: the file (or
    "defaults"), with " + --set" when there were overrides."""
    where = "defaults" if path is None else str(path)
    if key is None:
        return where + (" + --set" if overrides else "")
    named = _parts(key)
    for item in overrides:
        given = _parts(item.partition("=")[0].strip())
        shared = min(len(given), len(named))
        if given[:shared] == named[:shared]:
            return "--set"
    return where


def blame(message: str, path: str | Path | None, overrides: Sequence[str] = ()) -> str:
    """`message`, an error about a config value that names its key first (`env.id: ...`),
    after where that value came from (`value_source`): `--set env.id: unknown environment
    ...`, `my.toml: env.id: ...`; a message that names no key after the file (or
    "defaults") and " + --set" when there were overrides."""
    from rldojo.config import TrainConfig  # the package imports this module first

    found = _KEY.match(message)
    key = found.group(1) if found else None
    if key is not None and _parts(key)[0] not in TrainConfig.model_fields:
        key = None  # "grader preflight: ...": not a key of the config
    source = value_source(key, path, overrides)
    return f"{source} {message}" if source == "--set" else f"{source}: {message}"
