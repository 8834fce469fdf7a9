"""Where rldojo keeps what it computes once per machine: exported model weights, the judge
cache, the precision probe. `$RLDOJO_CACHE`, default `~/.cache/rldojo`."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("RLDOJO_CACHE", Path.home() / ".cache" / "rldojo"))
