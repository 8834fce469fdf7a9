"""`run.device`: resolution (auto, cpu, cuda, cuda:N) without a GPU, placement of the
trained model, the KL reference, the optimizer state and the batches, device-agnostic
batch and sampling code on `meta`, checkpoints that load with `map_location`, and what
`rldojo doctor` says about devices and backends."""

from __future__ import annotations

import coin_env  # noqa: F401  (registers coin-v1)
import pytest
import torch
from tiny_config import tiny_overrides

from rldojo.config import ConfigError, load_config
from rldojo.policy.device import autocast_device_type, model_device, resolve_device
from rldojo.training.batch import build_token_batch
from rldojo.types import Rollout

TINY = tiny_overrides(
    "env.id=coin-v1", "rollout.group_size=4", "sampling.max_new_tokens=6",
    "sampling.temperature=1.0", "optim.micro_batch_size=3", "optim.lr=1e-3",
    "env.train_tasks=20", "run.report_to=[]",
)  # fmt: skip


# ------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    ("spec", "count", "expected"),
    [("auto", 0, "cpu"), ("auto", 2, "cuda:0"), ("cpu", 2, "cpu"), ("cuda", 1, "cuda:0"),
     ("cuda:1", 2, "cuda:1")],
)  # fmt: skip
def test_resolve_device(spec, count, expected):
    assert resolve_device(spec, cuda_count=count) == torch.device(expected)


def test_auto_is_the_cpu_on_this_machine():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(("spec", "count", "says"), [
    ("cuda", 0, "asked for, but"), ("cuda:0", 0, "asked for, but"),
    ("cuda:3", 2, "has 2 CUDA device(s)"),
])  # fmt: skip
def test_missing_cuda_is_one_line_config_error(spec, count, says):
    with pytest.raises(ConfigError) as err:
        resolve_device(spec, cuda_count=count)
    message = str(err.value)
    assert message.startswith("run.device:") and says in message and "\n" not in message


def test_config_accepts_devices_and_rejects_others():
    assert load_config(None, []).run.device == "auto"
    for spec in ("cpu", "cuda", "cuda:3"):
        assert load_config(None, [f"run.device={spec}"]).run.device == spec
    for bad in ("gpu", "cuda:", "cuda:x", "mps"):
        with pytest.raises(ConfigError, match=r"run\.device"):
            load_config(None, [f"run.device={bad}"])


def test_trainer_fails_before_any_model_loads_without_cuda(tmp_path, monkeypatch):
    """An unavailable GPU stops the run in one line before the run directory exists."""
    from rldojo.policy import device as device_module
    from rldojo.training.trainer import Trainer

    monkeypatch.setattr(device_module, "cuda_device_count", lambda: 0)
    cfg = load_config(None, [*TINY, "run.device=cuda"])
    with pytest.raises(ConfigError, match=r"run\.device: 'cuda' asked for"):
        Trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_autocast_device_type():
    assert autocast_device_type(torch.device("cuda", 1)) == "cuda"
    assert autocast_device_type(torch.device("cpu")) == "cpu"
    assert autocast_device_type(torch.device("meta")) == "cpu"


# -------------------------------------------------------------------- placement


def _rollouts() -> list[Rollout]:
    def one(prompt, completion):
        return Rollout(
            task_id="t", env="e", messages=[], completion="",
            prompt_ids=tuple(prompt), completion_ids=tuple(completion),
            policy_mask=(True,) * len(completion), logprobs=(-1.0,) * len(completion),
            entropies=(0.5,) * len(completion),
        )  # fmt: skip

    return [one([1, 2, 3], [4, 5]), one([1, 2, 3], [6]), one([7, 8], [9, 10, 11])]


def test_token_batch_moves_to_meta_and_keeps_cpu_as_is():
    batch = build_token_batch(_rollouts(), pad_id=0, group_ids=[0, 0, 1])
    assert batch.to("cpu") is batch  # no copy on the CPU path
    meta = batch.rows(slice(0, 2)).to("meta")
    tensors = [meta.input_ids, meta.attention_mask, meta.position_ids, meta.completion_ids,
               meta.policy_mask, meta.behaviour_logprobs, meta.sampler_entropy,
               meta.versions]  # fmt: skip
    assert all(t is not None and t.device.type == "meta" for t in tensors)
    assert meta.group_index is not None and meta.group_index.device.type == "cpu"  # steering
    assert meta.prompt_len == batch.rows(slice(0, 2)).prompt_len


def test_model_device():
    assert model_device(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert model_device(lambda **kw: None) == torch.device("cpu")  # a callable stand-in


@pytest.mark.slow  # loads tiny-random
@pytest.mark.parametrize("lora", [None, {"r": 2}])
def test_training_model_and_reference_are_placed_on_the_device(lora):
    """`load_training_model` / `load_reference` put every weight on the run's device
    (`meta` here stands in for `cuda:N`: same `.to(device)`, no memory), LoRA included."""
    from rldojo.config import ModelConfig
    from rldojo.policy.training_model import load_reference, load_training_model

    if lora is not None:
        pytest.importorskip("peft")
    cfg = ModelConfig.model_validate({"name": "tiny-random", "lora": lora})
    meta = torch.device("meta")
    model, _ = load_training_model(cfg, None, meta)
    ref = load_reference(cfg, model, None, meta)
    assert all(p.device == meta for p in model.parameters()) and model.training
    assert all(p.device == meta for p in ref.parameters()) and not ref.training
    assert model_device(model) == meta


@pytest.mark.slow  # trains tiny-random
def test_trainer_places_everything_on_the_resolved_device(tmp_path):
    """Model, reference, optimizer state and the update's device agree (`cpu` here; the
    same code path puts them on `cuda:N`), and one step trains."""
    from rldojo.training.trainer import Trainer

    cfg = load_config(None, [*TINY, "run.device=cpu", "loss.kl_coef=0.01", "run.steps=1",
                             f"run.output_dir={tmp_path}"])  # fmt: skip
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        assert trainer.device == torch.device("cpu") and trainer.precision.device == "cpu"
        assert trainer.update.device == torch.device("cpu")
        assert model_device(trainer.ref_model) == torch.device("cpu")
        assert not any(p.requires_grad for p in trainer.ref_model.parameters())
        metrics = trainer.step()
        assert metrics.get("train/skipped") != 1
        states = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
        assert states and all(s["exp_avg"].device.type == "cpu" for s in states)
    finally:
        trainer.close()


def test_checkpoint_trainer_state_loads_with_map_location(tmp_path):
    """`trainer.pt` is read onto the host whatever device wrote it; the optimizer state
    follows its parameters' device."""
    from rldojo.store.checkpoint import load_trainer_state, save_checkpoint

    class _Model:
        def save_pretrained(self, path, safe_serialization=True):
            (path / "model.safetensors").write_bytes(b"")

    class _Tok:
        def save_pretrained(self, path):
            (path / "tokenizer.json").write_text("{}")

    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(3)
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = save_checkpoint(tmp_path, model=_Model(), tokenizer=_Tok(), optimizer=opt,
                           scheduler=sched, step=1, state={})  # fmt: skip
    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    fresh = torch.nn.Parameter(torch.ones(3))
    opt2 = torch.optim.AdamW([fresh], lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "load", spy)
        state = load_trainer_state(ckpt, opt2, sched2)
    assert seen.get("map_location") == "cpu" and state["step"] == 1
    exp_avg = opt2.state[fresh]["exp_avg"]
    assert exp_avg.device == fresh.device and torch.equal(exp_avg, opt.state[param]["exp_avg"])


# ----------------------------------------------------------------------- doctor


def test_doctor_reports_device_cuda_and_backends(monkeypatch):
    import importlib.util

    from rldojo.commands import doctor
    from rldojo.policy import device as device_module

    monkeypatch.setattr(device_module, "cuda_device_count", lambda: 0)
    real_find = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "vllm" else real_find(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    rows = {name: (status, detail) for name, status, detail in doctor._doctor_rows()}
    assert rows["device (auto)"][0] == "ok" and rows["device (auto)"][1].startswith("cpu")
    assert rows["cuda"][0] == "missing" and "torch" in rows["cuda"][1]
    assert rows["backend native"][0] == "ok"
    assert rows["backend vllm"][0] == "missing" and "not installed" in rows["backend vllm"][1]


def test_gpu_check_script_is_valid_bash_and_documents_itself():
    """`benchmarks/gpu_check.sh` parses, and `--help` prints its usage (the dry run of
    every part, `--device cpu --dry`, takes ~40 s: run by hand, see its header)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert out.returncode == 0 and "--device cpu --dry" in out.stdout


def test_doctor_reprobe_measures_again_and_rewrites_the_cache(tmp_path, monkeypatch):
    """A fresh cached probe is normally reused; `--reprobe` measures anyway, rewrites the
    entry and prints the new figures (the table then reads the rewritten entry)."""
    import json
    import time

    from typer.testing import CliRunner

    from rldojo.cli import app
    from rldojo.hardware import precision as hp

    monkeypatch.setenv("RLDOJO_CACHE", str(tmp_path))
    path = tmp_path / "precision.json"
    old = {"fp32": 50.0, "bf16": 1.5, "measured_at": time.time(),
           "cpu_flags": hp.cpu_flags(), "torch": torch.__version__}  # fmt: skip
    path.write_text(json.dumps({hp.machine_key(): old}))
    measured: list[torch.dtype] = []

    def measure_matmul(dtype, seconds=hp.PROBE_SECONDS):
        measured.append(dtype)
        return {torch.float32: 61.0, torch.bfloat16: 137.0}[dtype]  # not a timing

    monkeypatch.setattr(hp, "measure_matmul", measure_matmul)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert measured == []  # the fresh entry was reused
    result = CliRunner().invoke(app, ["doctor", "--reprobe"])
    assert result.exit_code == 0, result.output
    assert measured == [torch.float32, torch.bfloat16]  # once, by --reprobe
    text = " ".join(result.output.split())
    assert "measured again: fp32 61.0, bf16 137.0 GFLOP/s -> generation bfloat16" in text
    entry = json.loads(path.read_text())[hp.machine_key()]
    assert (entry["fp32"], entry["bf16"]) == (61.0, 137.0)
