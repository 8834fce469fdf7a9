"""`tools` on /v1/chat/completions: schemas rendered into the prompt, ``<tool_call>`` tags
parsed into OpenAI `tool_calls` (the environments' parser), through the real openai client.

Replies with tool calls come from a `ScriptedEngine` (a tiny random model writes none);
the rendering is checked on the real SmolLM2 template (which ignores `tools`) and on a
template that renders them.
"""

from __future__ import annotations

import json

import openai
import pytest

from rldojo.envs.tool_calls import parse_turn as envs_parse_turn
from rldojo.inference import ScriptedEngine, start_server
from rldojo.inference.chat_tools import (
    assistant_text,
    encode_with_tools,
    split_tool_calls,
    tools_system_prompt,
)
from rldojo.inference.engine import ChatRequest, TransformersEngine
from rldojo.inference.token_stream import releasable
from rldojo.inference.tool_calls import parse_turn

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ASK = [{"role": "user", "content": "What is 2+3?"}]


def test_the_envs_use_the_servers_parser():
    assert envs_parse_turn is parse_turn


def test_split_tool_calls_keeps_the_prose_and_reads_the_calls():
    content, calls = split_tool_calls(f"Let me add.\n{CALL}")
    assert content == "Let me add.\n"
    assert [c["function"]["name"] for c in calls] == ["add"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert split_tool_calls(CALL)[0] is None  # nothing but the call: no content
    assert split_tool_calls("no calls here") == ("no calls here", [])
    broken = "<tool_call>{not json</tool_call>"  # unreadable: left in the content
    content, calls = split_tool_calls(f"{broken}{CALL}")
    assert content == broken and len(calls) == 1


def test_assistant_text_writes_calls_one_a_line_as_the_experts_do():
    calls = [("add", '{"a": 2, "b": 3}'), ("add", {"a": 1, "b": 1})]
    two = CALL.replace("2, ", "1, ").replace("3}", "1}")
    assert assistant_text("Let me add.", calls) == f"Let me add.\n{CALL}\n{two}"
    assert assistant_text(None, calls) == assistant_text("", calls) == f"{CALL}\n{two}"
    assert assistant_text("5", []) == "5"
    _, read = split_tool_calls(assistant_text(None, calls))
    arguments = [json.loads(c["function"]["arguments"]) for c in read]
    assert arguments == [{"a": 2, "b": 3}, {"a": 1, "b": 1}]


def test_releasable_holds_back_what_may_start_a_marker():
    assert releasable("abc <tool", ("<tool_call>",)) == 4
    assert releasable("abc <tool_call>{...", ("<tool_call>",)) == 4
    assert releasable("abc", ("<tool_call>",)) == 3
    assert releasable("say STO", ("STOP", "ST")) == 4  # "ST" is in the text: cut there


@pytest.fixture(scope="module")
def scripted():
    """Calls `add` when tools are offered and no tool result is in yet; else answers."""

    def reply(request: ChatRequest) -> str:
        if request.messages[-1]["role"] == "tool":
            return "The sum is 5."
        return f"I will add them. {CALL}" if request.tools else "5"

    engine = ScriptedEngine(reply, model="m")
    with start_server(engine) as handle:
        yield engine, openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0)


@pytest.mark.slow  # starts a server
def test_tool_calls_come_back_as_openai_tool_calls(scripted):
    engine, client = scripted
    r = client.chat.completions.create(model="m", messages=ASK, tools=[ADD])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will add them. "
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert engine.requests[-1].tools == (ADD,)  # the schemas reach the engine as sent


@pytest.mark.slow  # starts a server
def test_tool_choice_none_switches_tools_off(scripted):
    engine, client = scripted
    r = client.chat.completions.create(model="m", messages=ASK, tools=[ADD], tool_choice="none")
    assert r.choices[0].message.content == "5" and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop" and engine.requests[-1].tools == ()


@pytest.mark.slow  # starts a server
def test_the_conversation_goes_back_with_its_calls_and_results(scripted):
    engine, client = scripted
    first = client.chat.completions.create(model="m", messages=ASK, tools=[ADD])
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r = client.chat.completions.create(model="m", messages=messages, tools=[ADD])
    assert r.choices[0].message.content == "The sum is 5."
    seen = engine.requests[-1].messages
    assert [m["role"] for m in seen] == ["user", "assistant", "tool"]
    assert parse_turn(seen[1]["content"]).calls[0].arguments == {"a": 2, "b": 3}
    assert seen[2]["content"] == "5"


@pytest.mark.slow  # starts a server
def test_streamed_tool_calls(scripted):
    _, client = scripted
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=[ADD], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "I will add them. "  # the tag itself is never sent as content
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert [(t.index, t.function.name) for t in calls] == [(0, "add")]
    assert json.loads(calls[0].function.arguments) == {"a": 2, "b": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.slow  # starts a server
@pytest.mark.parametrize(
    ("extra", "param", "code"),  # OpenAI's codes for the same faults
    [
        ({"tool_choice": "required"}, "tool_choice", "unsupported_value"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "add"}}},
            "tool_choice",
            "unsupported_value",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools.0.function.name",
            "invalid_value",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type", "invalid_value"),
    ],
)
def test_bad_tool_requests_are_400_naming_the_field(scripted, extra, param, code):
    _, client = scripted
    args = {"model": "m", "messages": ASK, "tools": [ADD]} | extra
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    assert err.value.body["code"] == code
    assert err.value.body["param"] == param and param in err.value.body["message"]


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_a_template_without_tools_gets_them_in_the_system_prompt(tiny):
    _, tokenizer = tiny
    ids = encode_with_tools(tokenizer, ASK, [ADD])
    text = tokenizer.decode(ids)
    assert tools_system_prompt([ADD]) in text and '"name":"add"' in text
    assert "You are a helpful AI assistant" not in text  # the tools' system turn replaces it
    plain = encode_with_tools(tokenizer, ASK, [])
    assert "<tools>" not in tokenizer.decode(plain)
    results = encode_with_tools(tokenizer, [*ASK, {"role": "tool", "content": "5"}], [ADD])
    assert "<tool_response>5</tool_response>" in tokenizer.decode(results)


@pytest.mark.slow  # the SmolLM2 tokenizer
def test_a_template_that_renders_tools_gets_them_as_tools(tiny):
    import copy

    _, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = tokenizer.decode(encode_with_tools(tokenizer, ASK, [ADD]))
    assert text.startswith("TOOLS:add;") and "<tools>" not in text


@pytest.mark.slow  # rldojo serve over tiny-random
def test_the_served_model_sees_the_tools(tiny):
    model, tokenizer = tiny
    engine = TransformersEngine("tiny-random", model=model, tokenizer=tokenizer, dtype="float32")
    with start_server(engine) as handle:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=60)
        args = {"model": "tiny-random", "messages": ASK, "max_tokens": 2, "temperature": 0}
        plain = client.chat.completions.create(**args)
        offered = client.chat.completions.create(**args, tools=[ADD])
        off = client.chat.completions.create(**args, tools=[ADD], tool_choice="none")
    engine.close()
    listed = len(tokenizer(tools_system_prompt([ADD]), add_special_tokens=False)["input_ids"])
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + listed // 2
    assert off.usage.prompt_tokens == plain.usage.prompt_tokens
