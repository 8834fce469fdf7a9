"""LoRA training on `tiny-random` (`model.lora`): only the adapters train, checkpoints hold
the adapter (`PeftModel.from_pretrained` loads it), a resume continues from it, and the
merged export (`rldojo export --merge`) is a plain model that generates what the
adapted policy generates."""

from __future__ import annotations

import json

import coin_env  # noqa: F401  (registers coin-v1: groups with signal from a random model)
import pytest
import torch
from tiny_config import tiny_overrides
from typer.testing import CliRunner

from rldojo.config import load_config
from rldojo.training.loop import run_training
from rldojo.training.trainer import Trainer
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # trains tiny-random with adapters

peft = pytest.importorskip("peft", reason="the `lora` extra (peft) is not installed")

TINY = tiny_overrides(
    "env.id=coin-v1", "model.generation_dtype=float32", "rollout.group_size=4",
    "sampling.max_new_tokens=8", "sampling.temperature=1.0", "optim.micro_batch_size=3",
    "optim.lr=0.05", "env.train_tasks=20", "run.report_to=[]",
    "model.lora={r = 4, alpha = 8, target_modules = ['q_proj', 'v_proj']}",
)  # fmt: skip


def _config(tmp_path, *extra: str):
    return load_config(None, [*TINY, f"run.output_dir={tmp_path}", *extra])


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _greedy_ids(model, tokenizer, n: int = 12) -> list[int]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+3="}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


def test_only_adapter_weights_train(tmp_path):
    trainer = Trainer(_config(tmp_path), tmp_path / "run")
    try:
        named = dict(trainer.model.named_parameters())
        adapters = {k for k, p in named.items() if p.requires_grad}
        assert adapters and all("lora_" in k for k in adapters)
        in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
        assert in_optimizer == {id(named[k]) for k in adapters}  # optimizer: adapters only
        before = _weights(trainer.model)
        metrics = trainer.step()
        assert metrics.get("train/skipped") != 1 and metrics["optim/grad_norm"] > 0
        after = _weights(trainer.model)
        for name in named:
            if name in adapters:
                continue
            assert torch.equal(before[name], after[name]), f"base weight {name} changed"
        assert any(not torch.equal(before[k], after[k]) for k in adapters)
    finally:
        trainer.close()


def test_checkpoint_is_an_adapter_and_merged_export_generates_the_same(tmp_path):
    from transformers import AutoModelForCausalLM

    from rldojo.cli import app
    from rldojo.policy.models import load_model

    cfg = _config(tmp_path, "run.steps=1", "run.name=lora")
    run_training(cfg)
    ckpt = tmp_path / "lora" / "checkpoints" / "step_000001"
    assert (ckpt / "adapter_config.json").exists()
    assert (ckpt / "adapter_model.safetensors").exists()
    assert not (ckpt / "model.safetensors").exists()  # the adapter alone, not the base
    assert json.loads((ckpt / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == "tiny-random"  # fmt: skip

    base, tokenizer = load_model("tiny-random")
    adapted = peft.PeftModel.from_pretrained(base, str(ckpt)).eval()
    out = tmp_path / "merged"
    result = CliRunner().invoke(app, ["export", str(ckpt), "--merge", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()  # plain transformers
    assert not any("lora" in k for k in merged.state_dict())
    assert _greedy_ids(merged, tokenizer) == _greedy_ids(adapted, tokenizer)
    # and the same as the trainer's own sampler on the adapted weights
    from rldojo.policy.transformers_backend import TransformersPolicy

    policy = TransformersPolicy(adapted, tokenizer, generation_dtype=None)
    ids = policy.encode_chat([{"role": "user", "content": "2+3="}])
    sampled = policy.generate([ids], SamplingParams(max_new_tokens=12, temperature=0.0))
    greedy = _greedy_ids(merged, tokenizer)
    assert list(sampled[0].token_ids) == greedy[: len(sampled[0].token_ids)]


def test_export_without_merge_of_an_adapter_is_one_line_error(tmp_path):
    from rldojo.cli import app

    run_training(_config(tmp_path, "run.steps=0", "run.name=zero"))
    ckpt = tmp_path / "zero" / "checkpoints" / "step_000000"
    result = CliRunner().invoke(app, ["export", str(ckpt), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--merge" in result.output


def test_adapter_checkpoint_resume_continues(tmp_path):
    cfg = _config(tmp_path, "run.steps=1", "run.name=res", "run.checkpoint_every=1")
    run_training(cfg)
    run = tmp_path / "res"
    ckpt = run / "checkpoints" / "step_000001"
    saved = peft.PeftModel.from_pretrained(
        __import__("rldojo.policy.models", fromlist=["x"]).load_model("tiny-random")[0],
        str(ckpt),
    )
    saved_adapters = {k: v for k, v in saved.state_dict().items() if "lora_" in k}
    resumed = Trainer(_config(tmp_path, "run.steps=2", "run.name=res"), run, resume=True)
    try:
        assert resumed.step_num == 1
        state = resumed.model.state_dict()
        assert saved_adapters and all(torch.equal(state[k], v) for k, v in saved_adapters.items())
        assert any(s for s in resumed.optimizer.state.values())  # AdamW moments restored
        base_before = {k: v.clone() for k, v in state.items() if "lora_" not in k}
        resumed.step()
        assert resumed.step_num == 2
        after = resumed.model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in base_before.items())
        assert any(not torch.equal(after[k], v) for k, v in saved_adapters.items())
    finally:
        resumed.close()


def test_lora_without_peft_is_one_line_error(tmp_path, monkeypatch):
    import builtins

    from rldojo.config import ConfigError

    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("no peft")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(ConfigError, match="rldojo\\[lora\\]"):
        Trainer(_config(tmp_path), tmp_path / "nopeft")
    assert not (tmp_path / "nopeft").exists()


def test_resume_mismatch_between_checkpoint_and_lora_is_one_line_error(tmp_path):
    from rldojo.config import ConfigError

    full = [o for o in TINY if not o.startswith("model.lora")]
    run_training(load_config(None, [*full, f"run.output_dir={tmp_path}", "run.steps=0",
                                    "run.name=full"]))  # fmt: skip
    with pytest.raises(ConfigError, match=r"holds full weights but model\.lora is set"):
        Trainer(_config(tmp_path, "run.name=full"), tmp_path / "full", resume=True)
    run_training(_config(tmp_path, "run.steps=0", "run.name=adapter"))
    cfg = load_config(None, [*full, f"run.output_dir={tmp_path}", "run.name=adapter"])
    with pytest.raises(ConfigError, match=r"holds a LoRA adapter but model\.lora is not set"):
        Trainer(cfg, tmp_path / "adapter", resume=True)


def test_lora_on_top_layers_only_trains_those_and_backward_stops_below(tmp_path):
    """`model.lora.layers = [1]` on tiny-random's 2 layers: adapters exist in layer 1 alone,
    only they change in a step, and layer 0's output carries no graph (nothing below the
    adapted layer trains, so autograd never reaches it)."""
    trainer = Trainer(_config(tmp_path, "model.lora.layers=[1]"), tmp_path / "run")
    try:
        named = dict(trainer.model.named_parameters())
        adapters = {k for k, p in named.items() if p.requires_grad}
        assert adapters and all(".layers.1." in k and "lora_" in k for k in adapters)
        layers = trainer.model.get_base_model().model.layers
        needs_grad: dict[int, bool] = {}

        def record(index: int):
            def hook(_module, _inputs, out) -> None:
                hidden = out[0] if isinstance(out, tuple) else out
                needs_grad[index] = needs_grad.get(index, False) or hidden.requires_grad

            return hook

        hooks = [layer.register_forward_hook(record(i)) for i, layer in enumerate(layers)]
        before = _weights(trainer.model)
        metrics = trainer.step()
        for hook in hooks:
            hook.remove()
        assert metrics.get("train/skipped") != 1 and metrics["optim/grad_norm"] > 0
        assert needs_grad == {0: False, 1: True}  # the training forward's graph starts at 1
        after = _weights(trainer.model)
        changed = {k for k in named if not torch.equal(before[k], after[k])}
        assert changed and changed <= adapters
    finally:
        trainer.close()


@pytest.mark.parametrize("layers", ["[2]", "[-1]", "[]"])
def test_lora_layers_outside_the_model_is_one_line_error(tmp_path, layers):
    from rldojo.config import ConfigValueError

    expected = r"model.lora.layers: .* tiny-random \(2 layers: 0-1\)"
    with pytest.raises(ConfigValueError, match=expected):
        Trainer(_config(tmp_path, f"model.lora.layers={layers}"), tmp_path / "run")
