"""A model object, its tokenizer and a `peft.LoraConfig` given to `rldojo.train` as TRL takes
them (`rldojo.api.model_args`): the run trains the object in place and records its id in
`config.toml`; what the object cannot do (other processes, unmapped LoRA fields) is a
one-line error."""

from __future__ import annotations

import tomllib

import pytest
import torch

import rldojo
from rldojo.config import ConfigValueError
from rldojo.policy import given_models
from rldojo.policy.errors import ModelLoadError
from rldojo.policy.models import check_model

pytestmark = pytest.mark.slow  # peft and transformers models


def varied(prompt, completion):
    """Rewards that differ within a group, so every step carries signal."""
    return float(sum(map(ord, completion)) % 5)


ROWS = [{"prompt": f"{a} + {a} ="} for a in range(4)]


def tiny_run(tmp_path, steps: int) -> dict:
    return {
        "model": {"autocast_bf16": False},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "dynamic_sampling": False},
        "sampling": {"max_new_tokens": 4},
        "loss": {"kl_coef": 0.01},  # its reference must be a copy, never the object
        "run": {"steps": steps, "threads": 1, "output_dir": str(tmp_path), "name": "obj"},
    }


def test_a_model_object_trains_in_place_under_its_lora_config(tmp_path):
    from peft import LoraConfig

    from rldojo.policy.models import load_model

    model, tokenizer = load_model("tiny-random")  # a fresh object: this test trains it
    q_proj = model.model.layers[0].self_attn.q_proj
    base_before = q_proj.weight.detach().clone()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj", "q_proj"])
    result = rldojo.train(tiny_run(tmp_path, 1), model=model, tokenizer=tokenizer,
                          peft_config=lora, tasks=ROWS, reward=varied)  # fmt: skip

    adapted = model.model.layers[0].self_attn.q_proj  # peft injected it into the object
    assert torch.equal(adapted.base_layer.weight, base_before)  # the base stays frozen
    b_after_1 = adapted.lora_B["default"].weight.detach().clone()
    assert b_after_1.abs().sum() > 0  # B starts at 0: only a gradient moves it
    saved = tomllib.loads((result.run_dir / "config.toml").read_text())["model"]
    assert saved["name"] == given_models.model_id(model)
    assert saved["name"].startswith("object:LlamaForCausalLM.")
    assert saved["lora"] == {"r": 4, "alpha": 8.0, "dropout": 0.0,
                             "target_modules": ["q_proj", "v_proj"]}  # fmt: skip

    # A resume in this process, with the same arguments, keeps training the object.
    again = rldojo.train(tiny_run(tmp_path, 2), model=model, tokenizer=tokenizer,
                         peft_config=lora, tasks=ROWS, reward=varied, resume=True)  # fmt: skip
    assert again.summary["steps"] == 2
    now = model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    assert not torch.equal(now, b_after_1)

    # Without the object (a new process, the CLI) the run's model is a one-line error.
    given_models._MODELS.pop(saved["name"])
    with pytest.raises(ModelLoadError, match="pass the model again") as err:
        rldojo.train(result.run_dir / "config.toml", run_dir=result.run_dir, resume=True)
    assert "\n" not in str(err.value)


def tiny_llama():
    """A 1-layer Llama built from a config: no tokenizer, no weights loaded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    ("section", "keys", "message"),
    [
        ("run", {"train_ranks": 2, "cluster": "ray"}, "run.train_ranks: a model object lives"),
        ("run", {"cluster": "ray"}, "run.cluster: a model object lives in this process"),
        ("generation", {"backend": "vllm"}, "generation.backend: a model object lives"),
    ],
)
def test_a_model_object_refuses_other_processes(tmp_path, section, keys, message):
    config = tiny_run(tmp_path, 1)
    config[section] = {**config.get(section, {}), **keys}
    with pytest.raises(ConfigValueError, match=message):
        rldojo.train(config, model=tiny_llama(), tasks=ROWS, reward=varied)


def test_lora_config_fields_without_a_model_lora_key_are_errors(tmp_path):
    from peft import LoraConfig

    from rldojo.policy.lora import lora_section

    config = tiny_run(tmp_path, 1)
    for lora, message in [
        (LoraConfig(use_dora=True), "peft_config.use_dora: True has no model.lora key"),
        (LoraConfig(bias="all"), "peft_config.bias: 'all' has no model.lora key"),
        (LoraConfig(target_modules=".*proj"), "peft_config.target_modules: '.*proj'"),
        (LoraConfig(task_type="SEQ_CLS"), "peft_config.task_type: 'SEQ_CLS'"),
        (LoraConfig(lora_dropout=1.5), r"peft_config \(as model.lora\): dropout: "),
    ]:
        with pytest.raises(ConfigValueError, match=message) as err:
            rldojo.train(config, model="tiny-random", peft_config=lora, tasks=ROWS, reward=varied)
        assert "\n" not in str(err.value)
    mapped = lora_section(LoraConfig(r=8, lora_alpha=16, layers_to_transform=1,
                                     target_modules={"q_proj"}, task_type="CAUSAL_LM"))  # fmt: skip
    got = (mapped.r, mapped.alpha, mapped.layers, mapped.target_modules)
    assert got == (8, 16, [1], ["q_proj"])
    assert lora_section(LoraConfig(target_modules="all-linear")).target_modules == "all-linear"


def test_a_model_object_without_a_tokenizer_to_load_is_an_error(tmp_path):
    with pytest.raises(ConfigValueError, match="tokenizer: required: the model object has no"):
        rldojo.train(tiny_run(tmp_path, 1), model=tiny_llama(), tasks=ROWS, reward=varied)
    with pytest.raises(ModelLoadError, match="in another process; pass the model again"):
        check_model("object:gone.0123456789ab")
