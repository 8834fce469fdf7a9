"""`rldojo serve --api-key`, `--served-model-name`, `--max-model-len` and `--chat-template`,
through the real openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from rldojo.inference import ScriptedEngine, start_server
from rldojo.inference.engine import TransformersEngine
from rldojo.inference.serve_options import ServeOptionError

pytestmark = pytest.mark.slow  # starts a server

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyed():
    engine = ScriptedEngine(lambda req: "hello there", model="runs/x/checkpoints/step_000001")
    with start_server(engine, api_key="s3cret", served_model_name="my-model") as handle:
        yield handle


def test_every_v1_route_wants_the_key(keyed):
    for key in ("wrong", "Bearer s3cret"):  # a wrong key; the key sent as the whole header
        client = openai.OpenAI(base_url=keyed.url, api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            client.models.list()
        assert err.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="my-model", messages=ASK)
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model="my-model", prompt="x", max_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            client.embeddings.create(model="my-model", input="x")
    bare = httpx.post(f"{keyed.url}/chat/completions", json={"model": "my-model", "messages": ASK})
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "invalid_request_error"
    health = httpx.get(keyed.url.removesuffix("/v1") + "/health")
    assert health.status_code == 200  # liveness needs no key


def test_the_key_and_the_served_name_let_requests_through(keyed):
    client = openai.OpenAI(base_url=keyed.url, api_key="s3cret", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["my-model"]
    assert keyed.model == "my-model"
    reply = client.chat.completions.create(model="my-model", messages=ASK)
    assert reply.model == "my-model" and reply.choices[0].message.content == "hello there"
    text = client.completions.create(model="my-model", prompt="say", max_tokens=4)
    assert text.model == "my-model" and text.choices[0].text == "hello there"
    with pytest.raises(openai.NotFoundError) as err:  # the checkpoint path is not its name now
        client.chat.completions.create(model="runs/x/checkpoints/step_000001", messages=ASK)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"


def test_without_options_nothing_changes():
    engine = ScriptedEngine(lambda req: "ok", model="m")
    with start_server(engine) as handle:
        client = openai.OpenAI(base_url=handle.url, api_key="anything", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["m"]
        assert client.chat.completions.create(model="m", messages=ASK).choices[0].message.content
        with pytest.raises(openai.NotFoundError) as err:  # a route it does not serve
            client.responses.create(model="m", input="hi")
    assert "/v1/responses" in err.value.body["message"]


TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def limited(tiny):
    """tiny-random served with `--max-model-len 64` and a chat template of its own."""
    model, tokenizer = tiny
    engine = TransformersEngine(
        "tiny-random",
        model=model,
        tokenizer=tokenizer,
        dtype="float32",
        max_model_len=64,
        chat_template=TEMPLATE,
    )
    with start_server(engine) as handle:
        yield handle, openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=60)
    engine.close()


def test_max_model_len_bounds_prompt_and_completion(limited):
    _, client = limited
    with pytest.raises(openai.BadRequestError) as err:  # more than the window holds
        client.chat.completions.create(model="tiny-random", messages=ASK, max_tokens=65)
    assert err.value.body["code"] == "invalid_value" and "64" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:  # fits alone, not with the prompt
        client.chat.completions.create(model="tiny-random", messages=ASK, max_tokens=60)
    body = err.value.body
    assert (body["param"], body["code"]) == ("max_tokens", "context_length_exceeded")
    assert "context of 64 tokens" in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-random", prompt=[5] * 64, max_tokens=1)
    assert (err.value.body["param"], err.value.body["code"]) == (
        "prompt",
        "context_length_exceeded",
    )
    fits = client.completions.create(model="tiny-random", prompt=[5] * 60, max_tokens=4)
    assert fits.usage.prompt_tokens == 60 and fits.usage.completion_tokens <= 4


def test_the_default_max_tokens_shrinks_to_what_the_window_leaves(limited):
    _, client = limited  # the default (256) is more than the 64-token window
    reply = client.chat.completions.create(model="tiny-random", messages=ASK, temperature=0)
    assert reply.usage.total_tokens <= 64 and reply.usage.completion_tokens >= 1


def test_the_chat_template_replaces_the_tokenizers(limited, tiny):
    handle, client = limited
    _, tokenizer = tiny
    reply = client.chat.completions.create(model="tiny-random", messages=ASK, max_tokens=1)
    rendered = tokenizer("user: hi\nassistant:", add_special_tokens=False)["input_ids"]
    assert reply.usage.prompt_tokens == len(rendered)
    assert tokenizer.chat_template != TEMPLATE  # the shared tokenizer is left as it was
    assert handle.engine.tokenizer.chat_template == TEMPLATE


def test_a_template_that_fails_on_a_conversation_is_a_400(tiny):
    model, tokenizer = tiny
    strict = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system turn first') }}"
        "{% endif %}"
    )
    engine = TransformersEngine(
        "tiny-random", model=model, tokenizer=tokenizer, dtype="float32", chat_template=strict
    )
    with start_server(engine) as handle:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny-random", messages=ASK, max_tokens=1)
    engine.close()
    assert (
        err.value.body["param"] == "messages" and "a system turn first" in err.value.body["message"]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_model_len": 4096}, "--max-model-len: 4096 is more than the model's 2048"),
        ({"max_model_len": 0}, "--max-model-len: must be at least 1"),
        ({"chat_template": "{% for m in messages %}"}, "--chat-template: line 1: Unexpected end"),
        ({"chat_template": "no/such/template.jinja"}, "--chat-template: no file no/such/"),
    ],
)
def test_bad_options_are_one_line_errors(tiny, options, message):
    model, tokenizer = tiny
    with pytest.raises(ServeOptionError) as err:
        TransformersEngine("tiny-random", model=model, tokenizer=tokenizer, **options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
