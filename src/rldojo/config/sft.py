"""The `[sft]` section: supervised fine-tuning on demonstrations (`rldojo sft`).

`rldojo sft CONFIG --data demos.jsonl` reads the same TOML file as `rldojo train`: the
model (`[model]`, LoRA included unless `sft.lora = false`), the optimizer's betas, weight
decay, clipping and micro-batch size (`[optim]`), the held-out evaluation (`[eval]`,
`[env]`) and the run directory (`[run]`) come from there; this section holds what only
SFT needs.
"""

from __future__ import annotations

from pydantic import Field

from rldojo.config.base import _Section


class SftConfig(_Section):
    data: str | None = None
    """Demonstrations, JSONL (`rldojo demos` writes them): one conversation per line,
    `{"messages": [...], "tools": [...] | null, ...}`; `--data` overrides."""
    epochs: int = Field(2, gt=0)
    """Passes over the demonstrations."""
    lr: float = Field(5e-5, gt=0.0)
    """Peak AdamW learning rate (linear warmup, then `optim.schedule` over the SFT steps)."""
    warmup_steps: int = Field(2, ge=0)
    """Steps of linear learning-rate warmup from 0."""
    batch_size: int = Field(16, gt=0)
    """Demonstrations per optimizer step (split into `optim.micro_batch_size` rows per
    forward/backward, gradients accumulated). The loss is the mean over the step's
    assistant tokens."""
    max_seq_len: int = Field(2048, gt=0)
    """Demonstrations longer than this many tokens (prompt and completion) are left out,
    and counted; a cut conversation would teach an episode without its end."""
    only_passed: bool = True
    """Train only on lines whose `passed` is true (lines without the key are kept)."""
    lora: bool = True
    """Whether SFT trains the adapters of `model.lora` (when set). `false`: SFT trains every
    weight and writes a full checkpoint, and `rldojo train` wraps it in fresh adapters, so
    one TOML holds a full-weight cold start and a LoRA RL stage
    (`examples/agentic_tictactoe.toml`)."""
    eval_before: bool = True
    """Evaluate the starting model on the held-out tasks too (`[eval]`), so one run gives
    both the base and the SFT accuracy, on the same tasks. `eval.before = false` skips it
    as well (either key is enough)."""
