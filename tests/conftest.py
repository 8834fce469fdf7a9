"""Shared fixtures: the tiny random model (SmolLM2's tokenizer, 2 random layers)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny():
    """`(model, tokenizer)` of `tiny-random`, built once per session."""
    from rldojo.policy.models import load_model

    torch.manual_seed(0)
    return load_model("tiny-random")
