"""The `[model]` section: which model trains, in which precision, with or without LoRA."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rldojo.config.base import _Section


class LoraSection(_Section):
    r: int = Field(16, gt=0)
    """Rank of each adapter's A/B matrices."""
    alpha: float = Field(32.0, gt=0.0)
    """Scale: the adapter's update is multiplied by alpha / r (peft's `lora_alpha`)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input while training (0: the PPO ratio of the sampler's
    tokens is not perturbed by dropout noise)."""
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    """Module names that get adapters (Llama-style names by default), or `"all-linear"`
    (every linear layer but the output layer)."""
    layers: list[int] | None = None
    """Decoder layers (0-based indices) that get adapters (peft's `layers_to_transform`);
    absent: every layer. With only the top layers adapted nothing below them trains, so
    the backward pass stops at the lowest adapted layer: e.g. `layers = [20, ..., 29]` of
    SmolLM2-135M's 30 (`benchmarks/partial_update_cost.py` measures what that saves)."""


class ModelConfig(_Section):
    name: str = "smollm2-135m-instruct"
    """Built-in name (`smollm2-135m-instruct`, `tiny-random`), local HF directory or hub id."""
    generation_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Dtype the sampler's weights are kept in. `auto`: bf16 where a timed matmul probe
    finds it at least 1.2x faster than fp32 on this machine (CPUs with bf16 units: ~2x),
    fp32 otherwise (AVX2-only CPUs emulate bf16 ~30x slower); bf16 on CUDA. The probe is
    cached per machine; see `rldojo.hardware.precision` and `rldojo doctor`. With fp32
    the sampler shares the trainer's weights (no second copy)."""
    autocast_bf16: Literal["auto"] | bool = "auto"
    """Train under bf16 autocast (fp32 master weights and optimizer state stay fp32).
    `auto`: the same measured choice as `generation_dtype`."""
    lora: LoraSection | None = None
    """LoRA adapters through `peft` (extra `lora`: `pip install 'rldojo[lora]'`), e.g.
    `lora = {r = 16, alpha = 32}`: only the adapter weights train (the optimizer holds
    their state alone) and checkpoints hold the adapter, loadable with
    `PeftModel.from_pretrained`; `rldojo export CKPT --merge --out DIR` writes a plain
    model. Absent (the default): full fine-tuning."""
