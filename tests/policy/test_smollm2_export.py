"""The SmolLM2 export ends turns in <|im_end|> whatever transformers read from the GGUF
(5.17 read <|im_start|>), an export with another end-of-sequence token is redone, and
the one-time conversion says when it starts and when it is done."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from transformers import AutoTokenizer

from rldojo.policy import models
from rldojo.policy.models import SMOLLM2_EOS, smollm2_dir
from rldojo.report.progress import log_lines

pytestmark = pytest.mark.slow  # exports SmolLM2 from its GGUF


def test_the_export_ends_turns_in_im_end_and_a_stale_one_is_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("RLDOJO_CACHE", str(tmp_path / "cache"))
    said: list[str] = []
    with log_lines(said.append, "rldojo.policy.models"):  # as the commands show them
        target = smollm2_dir()
        assert smollm2_dir() == target  # exported once: said once
    assert target.is_relative_to(tmp_path / "cache")
    assert said[0] == f"converting SmolLM2-135M-Instruct from GGUF (once; cached in {target})"
    assert re.fullmatch(r"converted SmolLM2-135M-Instruct in \d+ s", said[1]) and len(said) == 2
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    assert tokenizer.eos_token == tokenizer.pad_token == SMOLLM2_EOS
    assert (target / "model.safetensors").exists()

    # What an older transformers wrote: <|im_start|> as the end-of-sequence token. The
    # stale export is removed and the export runs again into the same place. The conversion
    # itself is the one checked above (a second GGUF conversion, ~20 s, would check it
    # twice): here it is that export, copied into place, and the copy refuses to land on
    # a stale export left behind.
    exported = tmp_path / "exported"
    shutil.copytree(target, exported)
    path = target / "tokenizer_config.json"
    stale = json.loads(path.read_text()) | {"eos_token": "<|im_start|>"}
    path.write_text(json.dumps(stale))
    redone: list[object] = []

    def export_again(where):
        redone.append(where)
        shutil.copytree(exported, where)  # FileExistsError over a stale export not removed

    monkeypatch.setattr(models, "_export_smollm2", export_again)
    with log_lines(said.append, "rldojo.policy.models"):
        assert smollm2_dir() == target
    assert redone == [target]
    assert said[2] == said[0] and len(said) == 4
    assert json.loads(path.read_text())["eos_token"] == SMOLLM2_EOS
    assert (target / "model.safetensors").exists()
