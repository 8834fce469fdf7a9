"""Writing run files so that a crash never leaves half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step (a temp file, then rename): a crash leaves the
    old file or the new one, never half of either."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
