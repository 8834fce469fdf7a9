"""Checkpoints: model weights (safetensors), optimizer and scheduler state, RNG, step.

Layout: `RUN/checkpoints/step_000012/{model.safetensors, trainer.pt, state.json}`, plus
the tokenizer and config so a checkpoint directory loads with `from_pretrained`. A
checkpoint is written to a temporary directory and renamed, so a crash mid-write never
leaves a half checkpoint that `--resume` would pick up. Rewriting a step that exists (a
resumed run saving its last step again) first renames the old one away whole, so a crash
never leaves it half deleted under its own name; the next save removes what a crash left.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def save_checkpoint(
    directory: Path,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    state: dict[str, Any],
) -> Path:
    """Write a complete checkpoint for `step` and return its directory."""
    final = directory / f"step_{step:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in [*directory.glob(".tmp_step_*"), *directory.glob(".old_step_*")]:
        shutil.rmtree(stale, ignore_errors=True)  # left by a writer killed mid-save
    tmp = directory / f".tmp_step_{step:06d}_{os.getpid()}"
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng_torch": torch.get_rng_state(),
            "rng_numpy": np.random.get_state(),
            "rng_python": random.getstate(),
        },
        tmp / "trainer.pt",
    )
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    if final.exists():  # a directory can't be renamed over a non-empty one: move it aside
        old = directory / f".old_step_{step:06d}_{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint under `directory`, or None."""
    if not directory.exists():
        return None
    done = sorted(p for p in directory.glob("step_*") if (p / "state.json").exists())
    return done[-1] if done else None


def load_trainer_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG from `checkpoint`; returns its state.json."""
    blob = torch.load(checkpoint / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    torch.set_rng_state(blob["rng_torch"])
    np.random.set_state(blob["rng_numpy"])
    random.setstate(blob["rng_python"])
    return dict(json.loads((checkpoint / "state.json").read_text()))
