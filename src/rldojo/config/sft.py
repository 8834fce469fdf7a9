"""The `[sft]` section: supervised fine-tuning on demonstrations (`rldojo sft`).

`rldojo sft CONFIG --data demos.jsonl` reads the same TOML file as `rldojo train`: the
model and its LoRA (`[model]`), the optimizer, its learning rate and schedule
(`[optim]`), the held-out evaluation (`[eval]`, `[env]`), the passes over the
demonstrations (`run.epochs`) and the run directory (`[run]`) come from there. This
section holds what only SFT has, and its tables of those shared keys for SFT alone
(`[sft.optim] lr = 5e-5`; `rldojo.config.stages`). Where the file sets no learning rate
or warmup, SFT takes `optim.lr = 5e-5`, `optim.warmup_steps = 2`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from rldojo.config.base import _Section
from rldojo.config.stages import stage_field

if TYPE_CHECKING:
    from rldojo.config import EvalConfig, OptimConfig
    from rldojo.config.model import ModelConfig
    from rldojo.config.run import RunConfig


class SftConfig(_Section):
    data: str | None = None
    """Demonstrations, JSONL (`rldojo demos` writes them): one conversation per line,
    `{"messages": [...], "tools": [...] | null, ...}`; `--data` overrides."""
    batch_size: int = Field(16, gt=0)
    """Demonstrations per optimizer step (split into `optim.micro_batch_size` rows per
    forward/backward, gradients accumulated). The loss is the mean over the step's
    assistant tokens."""
    max_seq_len: int = Field(2048, gt=0)
    """Demonstrations longer than this many tokens (prompt and completion) are left out,
    and counted; a cut conversation would teach an episode without its end."""
    only_passed: bool = True
    """Train only on lines whose `passed` is true (lines without the key are kept)."""
    model: ModelConfig | None = stage_field("model", "sft")
    """Keys of `[model]` for SFT alone, e.g. `lora = "none"`: SFT trains every weight and
    writes a full checkpoint, and `rldojo train` wraps it in the fresh adapters of
    `[model]`, so one TOML holds a full-weight cold start and a LoRA RL stage
    (`examples/agentic_tictactoe.toml`)."""
    optim: OptimConfig | None = stage_field("optim", "sft")
    """Keys of `[optim]` for SFT alone, e.g. `lr = 5e-5`, `warmup_steps = 2`."""
    eval: EvalConfig | None = stage_field("eval", "sft")
    """Keys of `[eval]` for SFT alone, e.g. `before = false` (the base model's accuracy
    is known: SFT evaluates its own checkpoint only)."""
    run: RunConfig | None = stage_field("run", "sft")
    """Keys of `[run]` for SFT alone, e.g. `epochs = 3`, `name = "my-sft"`."""
