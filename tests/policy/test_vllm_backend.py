"""The vLLM backend behind `Policy`: its output conversion and weight reload against a
stand-in engine (always), its config checks, and a real `vllm.LLM` on tiny-random where
vllm imports (skipped here otherwise, with the reason)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from rldojo.config import ConfigError, load_config
from rldojo.policy.vllm_backend import VLLMPolicy, check_vllm, plain_weights
from rldojo.types import SamplingParams


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Choice:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, _Logprob]]
    finish_reason: str


@dataclass
class _Engine:
    """Answers every prompt with its own last two token ids; records the calls."""

    rpcs: list = field(default_factory=list)
    params: list = field(default_factory=list)

    def generate(self, requests, params, use_tqdm=False):
        self.params.extend(params)
        outs = []
        for req in requests:
            ids = req["prompt_token_ids"][-2:]
            lps = [{t: _Logprob(-0.5), t + 1: _Logprob(-2.0)} for t in ids]
            choice = _Choice("ab", ids, lps, "length" if len(ids) == 2 else "stop")
            outs.append(types.SimpleNamespace(outputs=[choice]))
        return outs

    def collective_rpc(self, method, kwargs=None):
        self.rpcs.append((method, kwargs))


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` module whose SamplingParams records its arguments."""
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_generate_converts_outputs(tiny, fake_vllm):
    model, tokenizer = tiny
    engine = _Engine()
    policy = VLLMPolicy(model, tokenizer, engine=engine)
    sampling = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, stop=("\n",), seed=3)
    out = policy.generate([[1, 2, 3], [4, 5]], sampling)
    assert [c.token_ids for c in out] == [(2, 3), (4, 5)]
    assert all(c.logprobs == (-0.5, -0.5) and c.entropies == () for c in out)
    assert out[0].finish_reason == "length"
    assert [p["seed"] for p in engine.params] == [3, 4]  # one seed per prompt
    first = engine.params[0]
    assert (first["max_tokens"], first["temperature"], first["top_p"], first["stop"],
            first["logprobs"]) == (5, 0.7, 0.9, ["\n"], 0)  # fmt: skip
    policy.generate([[1, 2]], SamplingParams(max_new_tokens=2, temperature=0.0))
    assert engine.params[-1]["temperature"] == 0.0 and engine.params[-1]["seed"] is None


def test_update_weights_reloads_plain_weights(tiny, fake_vllm):
    model, tokenizer = tiny
    engine = _Engine()
    policy = VLLMPolicy(model, tokenizer, engine=engine)
    policy.update_weights()
    assert policy.version == 1
    method, kwargs = engine.rpcs[0]
    names = [name for name, _ in kwargs["weights_iterator"]]
    assert method == "reload_weights" and set(names) == set(model.state_dict())


def test_lora_weights_are_merged_before_reload(tiny):
    pytest.importorskip("peft")
    import copy

    from rldojo.config import LoraSection
    from rldojo.policy.lora import add_lora

    model, _ = tiny
    adapted = add_lora(copy.deepcopy(model), LoraSection(r=2), "tiny-random")
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    weights = plain_weights(adapted)
    assert set(weights) == set(model.state_dict())  # plain names, no lora_ keys
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(weights[q], model.state_dict()[q])  # the adapter is folded in


def test_check_vllm_config_errors(monkeypatch):
    check_vllm(load_config(None, []))  # native: nothing to check
    with pytest.raises(ConfigError, match="entropy_source"):
        check_vllm(load_config(None, ["generation.backend=vllm"]))
    with pytest.raises(ConfigError, match="max_policy_lag"):
        check_vllm(load_config(None, ["generation.backend=vllm", "loss.entropy_source=trainer",
                                      "rollout.max_policy_lag=1"]))  # fmt: skip
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ConfigError, match="vllm does not import"):
        check_vllm(load_config(None, ["generation.backend=vllm", "loss.entropy_source=trainer"]))


def _vllm_reason() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        return f"vllm does not import here ({type(exc).__name__}: {exc})"[:200]
    return None


@pytest.mark.slow
@pytest.mark.skipif(_vllm_reason() is not None, reason=str(_vllm_reason()))
def test_real_vllm_generates_and_reloads(tiny):
    model, tokenizer = tiny
    policy = VLLMPolicy(model, tokenizer, dtype="float32", gpu_memory_utilization=0.2)
    try:
        ids = policy.encode_chat([{"role": "user", "content": "hi"}])
        out = policy.generate([ids] * 2, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
        assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in out)
        policy.update_weights()
        assert policy.version == 1
    finally:
        policy.close()
