"""Loading straight into the shards (`rldojo.training.sharded_load`) gives, bit for bit,
what loading the whole model and sharding it gave: on 2 ranks (torchrun, gloo) and in one
process sharded (`run.shard = "fsdp"` at world size 1), from `tiny-random` (rank 0
broadcasts it), a safetensors directory (each rank reads its rows; rank 0 broadcasts when
the files name the tensors otherwise), the same with fresh LoRA adapters and with a LoRA
checkpoint's, a `dcp` checkpoint, and a frozen reference. Each case compares every rank's
shards, the tied output layer, rank 0's whole copy, the RNG state after the load, and one
forward pass; then, the shards moved, `gather_into` brings rank 0's whole copy to them
(tensor by tensor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # torchrun, two processes

CHILD = r"""
import copy, json, sys
from pathlib import Path
import torch
from rldojo.config import ModelConfig
from rldojo.policy.training_model import load_reference, load_training_model
from rldojo.training.distributed import full_state_dict, gather_into, init_dist, shard_model
from rldojo.training import sharded_load
from rldojo.training.sharded_load import load_sharded, sharded_reference

filled = []  # how each load filled its shards
for how in ("files", "dcp", "rank0"):
    def spy(*args, _how=how, _fill=getattr(sharded_load, f"_fill_from_{how}")):
        filled.append(_how)
        return _fill(*args)
    setattr(sharded_load, f"_fill_from_{how}", spy)

cases, out = json.loads(sys.argv[1]), Path(sys.argv[2])
cpu = torch.device("cpu")
d = init_dist("fsdp", cpu, 120)
local = lambda t: t.to_local() if hasattr(t, "to_local") else t

def tensors(net):
    return [(n, local(t)) for n, t in [*net.named_parameters(), *net.named_buffers()]]

def same(a, b):
    ta, tb = tensors(a), tensors(b)
    return [n for n, _ in ta] == [n for n, _ in tb] and all(
        x.dtype == y.dtype and torch.equal(x, y) for (_, x), (_, y) in zip(ta, tb))

def logits(net):
    ids = torch.arange(3, 11).reshape(2, 4) + 7 * d.rank
    with torch.no_grad():
        return net(input_ids=ids).logits

report = {}
for name, case in cases.items():
    cfg = ModelConfig.model_validate(case["model"])
    ckpt = Path(case["checkpoint"]) if case.get("checkpoint") else None
    torch.manual_seed(1)
    old, _ = load_training_model(cfg, ckpt, cpu)
    whole_old = copy.deepcopy(old) if d.main else None
    ref_old = load_reference(cfg, old, ckpt, cpu) if case.get("reference") else None
    for m in (old, ref_old):
        if m is not None:
            shard_model(m, d, cpu)
    rng_old = torch.get_rng_state()
    torch.manual_seed(1)
    filled.clear()
    new = load_sharded(cfg, ckpt, d, cpu, whole=True)
    ref_new = sharded_reference(cfg, new.model, ckpt, d, cpu) if case.get("reference") \
        else None
    rng_new = torch.get_rng_state()
    base = new.model.get_base_model() if hasattr(new.model, "get_base_model") else new.model
    r = {"shards": same(old, new.model),
         "rng": torch.equal(rng_old, rng_new) or not case.get("rng", True),
         "fill": filled[0] == case["fill"], "train": new.model.training,
         "tied": base.lm_head.weight is base.model.embed_tokens.weight,
         "logits": torch.equal(logits(old), logits(new.model))}
    if ref_new is not None:
        r["reference"] = same(ref_old, ref_new) and not ref_new.training and not any(
            p.requires_grad for p in ref_new.parameters())
    if d.main:
        r["whole"] = same(whole_old, new.whole) and not hasattr(
            next(new.whole.parameters()), "to_local")
    else:
        r["whole"] = new.whole is None
    with torch.no_grad():  # as a step moves the weights: the whole copy follows them
        for p in new.model.parameters():
            if p.requires_grad:
                local(p).mul_(-2.0).add_(0.5)
    lora = cfg.lora is not None
    gather_into(new.model, new.whole, d, adapters_only=lora)
    want = full_state_dict(new.model, d)
    if d.main:
        got = new.whole.state_dict()
        r["gathered"] = want.keys() == got.keys() and all(
            torch.equal(want[k], got[k]) for k in want)
    report[name] = r
(out / f"rank_{d.rank}.json").write_text(json.dumps(report))
d.close()
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """A safetensors copy of tiny-random (weights moved off their init), a LoRA adapter
    checkpoint on it, and a `dcp` checkpoint of other weights."""
    import torch.distributed.checkpoint as dcp

    from rldojo.config import LoraSection
    from rldojo.policy.lora import add_lora
    from rldojo.policy.models import load_model

    tmp = tmp_path_factory.mktemp("sources")
    model, tokenizer = load_model("tiny-random")
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i + 1))
    model.save_pretrained(tmp / "tiny")
    tokenizer.save_pretrained(tmp / "tiny")
    model.model.save_pretrained(tmp / "bare")  # the base model's names: no "model." prefix
    tokenizer.save_pretrained(tmp / "bare")
    lora = LoraSection.model_validate({"r": 4, "alpha": 8})
    adapted = add_lora(load_model(str(tmp / "tiny"))[0], lora, str(tmp / "tiny"))
    with torch.no_grad():
        for n, p in adapted.named_parameters():
            if "lora_B" in n:
                p.normal_()
    adapted.save_pretrained(tmp / "adapter")
    other = load_model(str(tmp / "tiny"))[0]
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    other.config.save_pretrained(tmp / "dcp_ckpt")
    tokenizer.save_pretrained(tmp / "dcp_ckpt")
    with warnings.catch_warnings():  # "assuming ... a single process": it is one
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": other.state_dict()}, checkpoint_id=str(tmp / "dcp_ckpt" / "dcp"),
                 no_dist=True)  # fmt: skip
    return {"tiny": tmp / "tiny", "bare": tmp / "bare", "adapter": tmp / "adapter",
            "dcp": tmp / "dcp_ckpt"}  # fmt: skip


def _cases(src: dict[str, Path]) -> dict[str, dict]:
    lora = {"r": 4, "alpha": 8}
    return {
        "tiny_random": {"model": {"name": "tiny-random"}, "reference": True, "fill": "rank0"},
        "safetensors": {"model": {"name": str(src["tiny"])}, "reference": True,
                        "fill": "files"},
        "lora": {"model": {"name": str(src["tiny"]), "lora": lora}, "fill": "files"},
        # files whose names are not the model's (from_pretrained maps them): rank 0 loads
        "other_names": {"model": {"name": str(src["bare"]), "lora": lora}, "fill": "rank0"},
        "lora_tiny_random": {"model": {"name": "tiny-random", "lora": lora}, "fill": "rank0"},
        "lora_checkpoint": {"model": {"name": str(src["tiny"]), "lora": lora},
                            "checkpoint": str(src["adapter"]), "fill": "files"},
        # one process reads a dcp checkpoint into a randomly initialised model (which
        # draws from the RNG); a resumed run restores the checkpoint's RNG state after
        "dcp": {"model": {"name": str(src["tiny"])}, "checkpoint": str(src["dcp"]),
                "rng": False, "fill": "dcp"},
    }  # fmt: skip


def _run(tmp: Path, ranks: int, cases: dict[str, dict]) -> list[dict]:
    script, out = tmp / "child.py", tmp / f"out{ranks}"
    script.write_text(CHILD)
    out.mkdir()
    launcher = [sys.executable, str(script)]
    if ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(ranks), str(script)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([*launcher, json.dumps(cases), str(out)], capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [2, 1])
def test_loading_into_the_shards_is_loading_whole_then_sharding(tmp_path, sources, ranks):
    cases = _cases(sources)
    for rank, report in enumerate(_run(tmp_path, ranks, cases)):
        assert set(report) == set(cases)
        for name, checks in report.items():
            failed = [k for k, ok in checks.items() if ok is not True]
            assert failed == [], (rank, name, checks)
