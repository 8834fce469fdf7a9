"""The `[distill]` section: distillation towards a teacher (`rldojo distill`).

`rldojo distill CONFIG` reads the same TOML file as `rldojo train`: the student is
`[model]` (LoRA and precision included), its prompts come from `[env]`, the sequences
are sampled per `[sampling]` (`max_new_tokens`, `temperature`), `rollout.prompts_per_step`
prompts per step, `run.steps` steps, with `[optim]`'s learning rate, betas, clipping and
micro-batches; the held-out evaluation is `[eval]`'s. This section holds what only
distillation needs. See `rldojo.training.distill` for the loss.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rldojo.config.base import _Section


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
