"""`rldojo serve --api-key` and `--served-model-name`, through the real openai client."""

from __future__ import annotations

import httpx
import openai
import pytest

from rldojo.inference import ScriptedEngine, start_server

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
