"""The `[distill]` section: distillation towards a teacher (`rldojo distill`).

`rldojo distill CONFIG` reads the same TOML file as `rldojo train`: the student is
`[model]` (LoRA and precision included), its prompts come from `[env]`, the sequences
are sampled per `[sampling]` (`max_new_tokens`, `temperature`), `run.steps` steps, with
`[optim]`'s learning rate, betas, clipping and micro-batches; the held-out evaluation is
`[eval]`'s. This section holds what only distillation has (the teacher, the loss, the
sequences a step), and its tables of those shared keys for distillation alone
(`[distill.optim] lr = 1e-4`; `rldojo.config.stages`). See `rldojo.training.distill` for
the loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from rldojo.config.base import _Section
from rldojo.config.stages import stage_field

if TYPE_CHECKING:
    from rldojo.config import EvalConfig, OptimConfig
    from rldojo.config.model import ModelConfig
    from rldojo.config.run import RunConfig


class DistillSection(_Section):
    teacher: str = "smollm2-135m-instruct"
    """The teacher model: a name, a directory or a checkpoint (`RUN/checkpoints/step_N`).
    It must share the student's tokenizer (e.g. the SmolLM2 family)."""
    divergence: Literal["forward", "reverse"] = "forward"
    """`forward`: KL(teacher || student), soft-label distillation (mean-seeking);
    `reverse`: KL(student || teacher), mode-seeking (on-policy distillation with
    `sequences = "student"`)."""
    sequences: Literal["teacher", "student"] = "teacher"
    """Who samples each step's training sequences: the teacher, or the current student
    (on-policy)."""
    kd_temperature: float = Field(1.0, gt=0.0)
    """Softening τ of both distributions in the loss; the loss is scaled by τ² so its
    gradient keeps its size."""
    batch_size: int = Field(8, gt=0)
    """Prompts a step, one sequence each (train tasks of `[env]`, shuffled with
    `run.seed`); `optim.micro_batch_size` rows a forward."""
    model: ModelConfig | None = stage_field("model", "distill")
    """Keys of `[model]` for distillation alone."""
    optim: OptimConfig | None = stage_field("optim", "distill")
    """Keys of `[optim]` for distillation alone, e.g. `lr = 1e-4`."""
    eval: EvalConfig | None = stage_field("eval", "distill")
    """Keys of `[eval]` for distillation alone."""
    run: RunConfig | None = stage_field("run", "distill")
    """Keys of `[run]` for distillation alone, e.g. `steps = 50`."""
