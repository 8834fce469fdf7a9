"""`rldojo export`: a training checkpoint as a plain transformers model directory.

A LoRA checkpoint (`model.lora`) holds only the adapter; `--merge` loads it onto its base
model and folds the adapter into the weights (`rldojo.policy.lora.export_checkpoint`), so
the result loads with `AutoModelForCausalLM.from_pretrained` alone, serves with
`rldojo serve` or vLLM, and needs no `peft`. A full fine-tuning checkpoint is written
without the optimizer state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    checkpoint: Annotated[Path, typer.Argument(help="RUN/checkpoints/step_N")],
    out: Annotated[Path, typer.Option("--out", help="Model directory to write")],
    merge: Annotated[
        bool, typer.Option("--merge", help="Fold a LoRA adapter into its base weights")
    ] = False,
) -> None:
    """Write a checkpoint as a plain HF model directory (LoRA adapters merged)."""
    from rldojo.commands.ui import console, fail, user_errors
    from rldojo.policy.lora import export_checkpoint

    if not checkpoint.is_dir():
        fail(f"{checkpoint}: no such checkpoint directory")
    try:
        written = export_checkpoint(checkpoint, out, merge=merge)
    except user_errors() as exc:
        fail(str(exc))
    console.print(f"wrote {written} (load with AutoModelForCausalLM.from_pretrained)")
