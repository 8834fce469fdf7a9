"""Scaled dot-product attention with no fully masked query row: `SAFE_SDPA`.

rldojo's batches are left padded (prompts in `rldojo.training.batch`, SFT micro-batches,
generation prompts). Under a causal mask a padding position has no key it may attend to:
its whole row of the attention mask is False. What SDPA makes of such a row depends on
the kernel. The CPU kernels return zeros (`_safe_softmax`); on CUDA the gradient of such
a row can be NaN, and autograd multiplies it by the zero gradient that reaches a padding
position (0 x NaN = NaN), so a single padded row puts NaN into every weight's gradient
while the loss itself stays finite. (Seen on an H200, torch 2.11: SFT on tic-tac-toe
demonstrations, loss 0.60 and gradient norm NaN at step 3, every loss NaN after.)
transformers used to patch such rows (`_unmask_unattended`); its `allow_torch_fix` has no
effect in 5.x.

`SAFE_SDPA` is transformers' SDPA with one change to its mask: a row with no key left
attends to every key instead. Its output is a finite average that no real token reads
(real tokens never attend to padding keys), and every real token keeps exactly the mask
it had, so outputs at real positions are unchanged. `load_model` switches models that
use "sdpa" to it; a model with another attention (eager, flash) is left as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SAFE_SDPA = "rldojo_sdpa"


def safe_sdpa_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' `sdpa_mask`, with every fully masked query row unmasked. A boolean
    `[B, 1, Q, K]` mask (True: attend), or None (no mask needed: `is_causal`)."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return mask
    return mask | ~mask.any(dim=-1, keepdim=True)  # [B, 1, Q, K]


def register_safe_sdpa() -> None:
    """Make `SAFE_SDPA` an attention implementation transformers knows (idempotent)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(SAFE_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(SAFE_SDPA, safe_sdpa_mask)


def use_safe_sdpa(model: PreTrainedModel) -> None:
    """Switch `model` from "sdpa" to `SAFE_SDPA` (any other attention is left alone)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return
    register_safe_sdpa()
    model.set_attn_implementation(SAFE_SDPA)
