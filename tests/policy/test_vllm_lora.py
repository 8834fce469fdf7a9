"""vLLM serving a LoRA-wrapped trainer's adapter as a vLLM LoRA adapter
(`policy/vllm_lora.py`): the publish protocol and the merged-weights fallback against a
stand-in engine (always, where peft imports), and a real `vllm.LLM` with `enable_lora`
where vllm imports (`make test-vllm`; skipped elsewhere, with the reason).

The real engine serves tiny-random with head size 32 (the fixtures of
`test_vllm_backend.py`) in fp32 on its base weights, the adapter (random nonzero lora_B)
through a `LoRARequest`, and is checked against the adapted trainer's own forward pass:
greedy ids, log-probs, and after simulated optimizer steps the new adapter's greedy ids,
with the base weights never reloaded."""

from __future__ import annotations

import copy
import os
import sys
import types
import warnings
from dataclasses import dataclass, field

import pytest
import torch
from policy.test_vllm_backend import (
    GREEDY,
    LOGPROB_TOL,
    PROMPTS,
    _Engine,
    _trainer_greedy,
    _trainer_logprobs,
)
from vllm_support import needs_vllm, servable_model

from rldojo.config import LoraSection
from rldojo.policy.vllm_backend import VLLMPolicy
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # tiny-random with adapters, and vllm where it imports

pytest.importorskip("peft")


def _adapted(model, r=2, seed=2):
    """`model` (a copy) under fresh adapters whose lora_B is random, so they change it."""
    from rldojo.policy.lora import add_lora

    adapted = add_lora(copy.deepcopy(model), LoraSection(r=r), "tiny-random").eval()
    _shake_lora_b(adapted, seed, replace=True)
    return adapted


def _shake_lora_b(model, seed, replace=False):
    """A stand-in optimizer step: new (or perturbed) lora_B matrices."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                noise = torch.randn(p.shape, generator=gen)
                p.copy_(noise) if replace else p.add_(noise)


@dataclass
class _LoraRequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class _LoraEngine(_Engine):
    """A stand-in engine started with LoRA: holds adapters by id as vLLM's manager does
    (`refuse`: the error its `add_lora` raises, as vLLM does for an adapter it lacks)."""

    refuse: str | None = None
    loras: dict = field(default_factory=dict)
    served: list = field(default_factory=list)  # each generate's lora_request

    def __post_init__(self):
        config = types.SimpleNamespace(lora_config=object())
        self.llm_engine = types.SimpleNamespace(vllm_config=config, add_lora=self._add,
                                                remove_lora=self._remove)  # fmt: skip

    def generate(self, requests, params, use_tqdm=False, lora_request=None):
        self.served.append(lora_request)
        return super().generate(requests, params, use_tqdm)

    def _add(self, request):
        if self.refuse:
            raise ValueError(self.refuse)
        assert os.path.exists(os.path.join(request.lora_path, "adapter_config.json"))
        self.loras[request.lora_int_id] = request.lora_path
        return True

    def _remove(self, lora_id):
        return self.loras.pop(lora_id, None) is not None


@pytest.fixture
def fake_lora_vllm(monkeypatch):
    """A `vllm` module with SamplingParams and `vllm.lora.request.LoRARequest`."""
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = _LoraRequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)


def test_adapter_is_published_per_version(tiny, fake_lora_vllm):
    """Each update saves and loads the adapter under a new id, passed with each generate;
    the previous one leaves the engine and the disk; the base weights are not reloaded."""
    model, tokenizer = tiny
    engine = _LoraEngine()
    policy = VLLMPolicy(_adapted(model), tokenizer, engine=engine)
    assert (policy.weight_sync, policy.lora_fallback) == ("adapter", None)
    root, ids = policy._adapters.root, [policy.lora_request.lora_int_id]
    assert engine.loras == {ids[0]: policy.lora_request.lora_path}
    for step in range(1, 4):
        policy.update_weights()
        ids.append(policy.lora_request.lora_int_id)
        policy.generate([[1, 2]], SamplingParams(max_new_tokens=2))
        assert engine.served[-1] is policy.lora_request and policy.version == step
        assert list(engine.loras) == [ids[-1]]  # the previous adapter was removed
        assert os.listdir(root) == [os.path.basename(policy.lora_request.lora_path)]
        files = set(os.listdir(policy.lora_request.lora_path))
        assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert ids == sorted(set(ids))  # a new, larger id per version
    assert engine.rpcs == []  # no reload_weights, no prefix-cache reset
    with pytest.raises(ValueError, match="no state_dict"):
        policy.update_weights({})
    policy.close()
    assert not os.path.exists(root)


def test_falls_back_to_merged_weights_with_a_warning(tiny, fake_lora_vllm):
    """An adapter vLLM refuses, an engine without LoRA or a rank vLLM cannot take: the
    adapters are merged and the full weights reloaded, and a one-line warning says why;
    `lora_adapters=False` asks for that path, silently."""
    model, tokenizer = tiny
    engine = _LoraEngine(refuse="vLLM does not yet support DoRA.")
    with pytest.warns(UserWarning, match=r"merged full weights.*\(vLLM did not .*DoRA"):
        policy = VLLMPolicy(_adapted(model), tokenizer, engine=engine)
    assert policy.weight_sync == "merged" and "DoRA" in str(policy.lora_fallback)
    method, kwargs = engine.rpcs[0]  # served merged weights at once
    assert method == "reload_weights"
    assert {name for name, _ in kwargs["weights_iterator"]} == set(model.state_dict())
    policy.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    policy.update_weights()
    assert engine.served == [None] and engine.rpcs[2][0] == "reload_weights"
    with pytest.warns(UserWarning, match="without enable_lora"):
        assert VLLMPolicy(_adapted(model), tokenizer, engine=_Engine()).weight_sync == "merged"
    big = _adapted(model)
    big.peft_config["default"].r = 600
    with pytest.warns(UserWarning, match="rank 600 is above"):
        VLLMPolicy(big, tokenizer, engine=_LoraEngine())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = VLLMPolicy(_adapted(model), tokenizer, engine=_LoraEngine(), lora_adapters=False)
    assert not [w for w in caught if "LoRA adapters served" in str(w.message)]
    assert (plain.weight_sync, plain.lora_fallback) == ("merged", "lora_adapters=False")


@needs_vllm
def test_vllm_refuses_an_adapter_it_cannot_serve(tiny):
    """vLLM's own adapter rules decide, before an engine starts (here: DoRA)."""
    import peft

    from rldojo.policy.vllm_lora import engine_lora_kwargs, unservable_reason

    config = peft.LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)
    dora = peft.get_peft_model(copy.deepcopy(tiny[0]), config)
    assert "DoRA" in str(unservable_reason(dora))
    assert unservable_reason(_adapted(tiny[0])) is None
    assert engine_lora_kwargs(_adapted(tiny[0], r=9))["max_lora_rank"] == 16  # rounded up


@pytest.fixture(scope="module")
def lora_served(tiny):
    """One LoRA engine for the module: `(policy, adapted, base, prompts)`."""
    base = servable_model(tiny)
    adapted = _adapted(base, r=4)
    policy = VLLMPolicy(adapted, tiny[1], dtype="float32", gpu_memory_utilization=0.02,
                        enforce_eager=True)  # fmt: skip
    prompts = [policy.encode_chat([{"role": "user", "content": c}]) for c in PROMPTS]
    root = policy._adapters.root if policy._adapters else None
    yield policy, adapted, base, prompts
    policy.close()
    assert root is None or not os.path.exists(root)  # the adapters' directories are gone


def _engine_weights(llm):
    """The engine's own parameters (base layers; vLLM keeps adapters in buffers)."""
    return llm.apply_model(lambda m: {n: p.detach().clone() for n, p in m.named_parameters()})[0]


@needs_vllm
def test_real_vllm_serves_the_adapter(lora_served):
    """Greedy ids through the LoRA request equal the adapted trainer's and differ from the
    base's; their log-probs match the adapted trainer's forward."""
    policy, adapted, base, prompts = lora_served
    assert (policy.weight_sync, policy.lora_fallback) == ("adapter", None)
    for prompt, c in zip(prompts, policy.generate(prompts, GREEDY), strict=True):
        assert list(c.token_ids) == _trainer_greedy(adapted, prompt, 10)
        assert list(c.token_ids) != _trainer_greedy(base, prompt, 10)
        assert torch.allclose(torch.tensor(c.logprobs),
                              _trainer_logprobs(adapted, prompt, c.token_ids),
                              atol=LOGPROB_TOL)  # fmt: skip


@needs_vllm
def test_real_vllm_publishes_new_adapters_without_reloading_the_base(lora_served, monkeypatch):
    """After simulated optimizer steps (same prompts, so a stale prefix cache would hit),
    the greedy ids become the new adapter's; the base weights are never reloaded (no
    `reload_weights` call, the engine's parameters unchanged); ids increase; one adapter
    directory is kept."""
    policy, adapted, _, prompts = lora_served
    original = {k: v.clone() for k, v in adapted.state_dict().items()}
    calls, rpc = [], policy.llm.collective_rpc

    def spy(method, *args, **kwargs):
        calls.append(method)
        return rpc(method, *args, **kwargs)

    monkeypatch.setattr(policy.llm, "collective_rpc", spy)
    weights = _engine_weights(policy.llm)
    before = policy.generate(prompts, GREEDY)
    version, lora_id = policy.version, policy.lora_request.lora_int_id
    try:
        for step in range(1, 4):
            _shake_lora_b(adapted, seed=10 + step)
            policy.update_weights()
            assert policy.version == version + step
            assert policy.lora_request.lora_int_id > lora_id
            lora_id = policy.lora_request.lora_int_id
            assert policy.llm.llm_engine.list_loras() == {lora_id}
            assert len(os.listdir(policy._adapters.root)) == 1
            after = policy.generate(prompts, GREEDY)
            for prompt, old, new in zip(prompts, before, after, strict=True):
                assert list(new.token_ids) == _trainer_greedy(adapted, prompt, 10)
                assert list(new.token_ids) != list(old.token_ids)
            before = after
        assert "reload_weights" not in calls
        current = _engine_weights(policy.llm)
        assert current.keys() == weights.keys()
        assert all(torch.equal(current[n], w) for n, w in weights.items())
    finally:
        adapted.load_state_dict(original)
        policy.update_weights()


@needs_vllm
def test_real_vllm_adapter_logprobs_at_temperature(lora_served):
    """Seeded samples through the LoRA request: the behaviour log-probs are the adapted
    trainer's at the sampling temperature."""
    policy, adapted, _, prompts = lora_served
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=5)
    first = policy.generate(prompts, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in policy.generate(prompts, params)]
    for prompt, c in zip(prompts, first, strict=True):
        expected = _trainer_logprobs(adapted, prompt, c.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=LOGPROB_TOL)
