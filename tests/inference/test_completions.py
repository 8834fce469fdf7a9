"""/v1/completions of `rldojo serve`: raw prompts and token ids, legacy `logprobs`, `echo`
for prompt log-likelihoods (what lm-evaluation-harness sends), streaming and 400s;
through the real openai client on loopback, over `tiny-random`."""

from __future__ import annotations

import openai
import pytest
import torch

pytestmark = pytest.mark.slow  # rldojo serve over tiny-random

PROMPT = "The capital of France is"


def _complete(client, **kw):
    return client.completions.create(**({"model": "tiny-random", "prompt": PROMPT} | kw))


def _raw_logprobs(server, ids: list[int]) -> torch.Tensor:
    """log-softmax of the served model's logits at every position of `ids`: [L, V]."""
    with torch.no_grad():
        logits = server.engine._gen_model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), -1)


def test_prompt_shapes_and_prompt_major_choices(server, client):
    tokenizer = server.engine.tokenizer
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    greedy = {"max_tokens": 4, "temperature": 0.0}
    one = _complete(client, **greedy)
    assert one.object == "text_completion" and len(one.choices) == 1
    assert one.usage.prompt_tokens == len(ids) and one.usage.completion_tokens <= 4
    by_ids = _complete(client, prompt=ids, **greedy)
    assert by_ids.choices[0].text == one.choices[0].text  # text and its ids: same prompt
    many = _complete(client, prompt=[PROMPT, "Hello"], n=2, **greedy)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == one.choices[0].text
    hello = _complete(client, prompt="Hello", **greedy).choices[0].text
    assert many.choices[2].text == hello
    two_ids = _complete(client, prompt=[ids, ids[:2]], **greedy)
    assert two_ids.choices[0].text == one.choices[0].text
    assert two_ids.usage.prompt_tokens == len(ids) + 2


def test_echo_scores_the_prompt_with_max_tokens_zero(server, client):
    ids = server.engine.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    r = _complete(client, max_tokens=0, echo=True, logprobs=3)
    choice = r.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    lp = choice.logprobs
    assert "".join(lp.tokens) == PROMPT and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    raw = _raw_logprobs(server, ids)
    expected = [raw[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    for i, top in enumerate(lp.top_logprobs[1:], start=1):
        assert 3 <= len(top) <= 4  # the 3 most likely, and the prompt's token if not among them
        assert max(top.values()) == pytest.approx(raw[i - 1].max().item(), abs=1e-4)
        assert top[lp.tokens[i]] == lp.token_logprobs[i]
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    assert lp.text_offset == offsets


def test_loglikelihood_request_as_lm_eval_sends_it(server, client):
    """lm-eval's local-completions: token ids, echo, logprobs=1, max_tokens=1; it sums
    token_logprobs[ctxlen:-1] and calls the continuation greedy when each is its top."""
    tokenizer = server.engine.tokenizer
    context = tokenizer("Question: 2+2? Answer:", add_special_tokens=False)["input_ids"]
    continuation = tokenizer(" 4", add_special_tokens=False)["input_ids"]
    r = _complete(client, prompt=[context + continuation], max_tokens=1, echo=True,
                  logprobs=1, temperature=0.0, seed=1234)  # fmt: skip
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(context) + len(continuation) + 1
    scored = lp.token_logprobs[len(context) : -1]
    raw = _raw_logprobs(server, context + continuation)
    expected = [raw[len(context) + i - 1, t].item() for i, t in enumerate(continuation)]
    assert sum(scored) == pytest.approx(sum(expected), abs=1e-4)
    generated = lp.token_logprobs[-1]  # the greedy token: the most likely one
    assert generated == max(lp.top_logprobs[-1].values())


def test_logprobs_of_the_completion(server, client):
    r = _complete(client, max_tokens=5, temperature=0.0, logprobs=2)
    choice = r.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == r.usage.completion_tokens
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob == pytest.approx(max(top.values()), abs=1e-5)  # greedy: the top token
        assert all(v <= 0 for v in top.values())
    assert lp.text_offset[0] == 0


def test_seed_stop_and_n(client):
    a = _complete(client, max_tokens=8, temperature=1.0, seed=5, n=2)
    b = _complete(client, max_tokens=8, temperature=1.0, seed=5, n=2)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    whole = _complete(client, max_tokens=12, temperature=1.0, seed=9).choices[0].text
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    cut = _complete(client, max_tokens=12, temperature=1.0, seed=9, stop=[stop]).choices[0]
    assert cut.text == whole[: whole.index(stop)] and cut.finish_reason == "stop"


def test_stream_sends_the_same_text(client):
    whole = _complete(client, max_tokens=10, temperature=0.0)
    chunks = list(_complete(client, max_tokens=10, temperature=0.0, stream=True))
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert len(chunks) == whole.usage.completion_tokens
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    echoed = list(
        _complete(
            client,
            max_tokens=3,
            temperature=0.0,
            stream=True,
            echo=True,
            stream_options={"include_usage": True},
        )
    )
    assert echoed[0].choices[0].text == PROMPT
    assert echoed[-1].choices == [] and echoed[-1].usage.completion_tokens <= 3
    logprobs = list(_complete(client, max_tokens=4, temperature=0.0, stream=True, logprobs=1))
    entries = [c.choices[0].logprobs.token_logprobs[0] for c in logprobs]
    reference = _complete(client, max_tokens=4, temperature=0.0, logprobs=1).choices[0]
    assert entries == pytest.approx(reference.logprobs.token_logprobs, abs=1e-4)


@pytest.mark.parametrize(
    ("args", "param", "code"),  # OpenAI's codes for the same faults
    [
        ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"prompt": []}, "prompt", "empty_array"),
        ({"prompt": [[1, 2], []]}, "prompt", "empty_array"),
        ({"prompt": [10**9]}, "prompt", "invalid_value"),
        ({"prompt": {"text": "x"}}, "prompt", "invalid_type"),
        ({"logprobs": 21}, "logprobs", "integer_above_max_value"),
        ({"temperature": 3}, "temperature", "decimal_above_max_value"),
        ({"suffix": "and so on"}, "suffix", "unsupported_parameter"),
        ({"best_of": 3}, "best_of", "unsupported_value"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"stream": True, "echo": True, "logprobs": 1}, "stream", "unsupported_value"),
        # tiny-random's context: 2048 tokens; more can never fit, whatever the prompt
        ({"max_tokens": 4000}, "max_tokens", "invalid_value"),
        ({"max_tokens": 10**6}, "max_tokens", "invalid_value"),
        # read by inspect-ai as a length stop
        ({"max_tokens": 2047}, "max_tokens", "context_length_exceeded"),
        ({"prompt": [5] * 2048, "max_tokens": 1}, "prompt", "context_length_exceeded"),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, args, param, code):
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, **args)
    body = err.value.body
    assert body["param"] == param and param in body["message"]
    assert body["type"] == "invalid_request_error" and body["code"] == code
    if param == "max_tokens" and args["max_tokens"] > 2048:  # the message names the limit
        assert f"{args['max_tokens']} is too large" in body["message"] and "2048" in body["message"]


def test_another_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as err:
        _complete(client, model="gpt-3.5-turbo-instruct", max_tokens=1)
    assert err.value.body["code"] == "model_not_found"


def test_an_empty_prompt_is_the_end_of_text_token(client):
    r = _complete(client, prompt="", max_tokens=2, temperature=0.0)
    assert r.usage.prompt_tokens == 1 and 1 <= r.usage.completion_tokens <= 2
