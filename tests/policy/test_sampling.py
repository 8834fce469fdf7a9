"""The cached decode loop: padding-invariance, logprobs, seeds, lengths, stops."""

from __future__ import annotations

import torch

from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams


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
