"""The SmolLM2 export ends turns in <|im_end|> whatever transformers read from the GGUF
(5.17 read <|im_start|>), and an export with another end-of-sequence token is redone."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from rldojo.policy.models import SMOLLM2_EOS, smollm2_dir

pytestmark = pytest.mark.slow  # exports SmolLM2 from its GGUF


def test_the_export_ends_turns_in_im_end_and_a_stale_one_is_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("RLDOJO_CACHE", str(tmp_path))
    target = smollm2_dir()
    assert target.is_relative_to(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    assert tokenizer.eos_token == tokenizer.pad_token == SMOLLM2_EOS
    # what an older transformers wrote: <|im_start|> as the end-of-sequence token
    path = target / "tokenizer_config.json"
    stale = json.loads(path.read_text()) | {"eos_token": "<|im_start|>"}
    path.write_text(json.dumps(stale))
    assert smollm2_dir() == target
    assert json.loads(path.read_text())["eos_token"] == SMOLLM2_EOS
    assert (target / "model.safetensors").exists()
