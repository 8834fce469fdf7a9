"""Demonstrations in OpenAI's tool-calling shape: turns as `tool_calls` with their ids,
results naming them, the turns that shape cannot give back staying text, and every
conversation read back by `rldojo sft` to exactly the text it was written from."""

from __future__ import annotations

import json

import pytest

from rldojo.inference.tool_calls import parse_turn
from rldojo.rollout.openai_demos import openai_messages, openai_record
from rldojo.training.demo_data import text_messages

TOOLS = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]

SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "Ember"}}</tool_call>'
GET = '<tool_call>{"name": "get", "arguments": {"id": 7, "full": true}}</tool_call>'


def _result(n: int) -> dict:
    return {"role": "tool", "content": f"<tool_response>{n}</tool_response>"}


def _demo(*turns: str, results: int | None = None) -> list[dict]:
    """An opening, then each turn followed by one result per call (`results` if given)."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i, turn in enumerate(turns):
        messages.append({"role": "assistant", "content": turn})
        calls = len(parse_turn(turn).calls) if results is None else results
        messages.extend(_result(k) for k in range(calls) if i < len(turns) - 1)
    return messages


def _as_text(messages: list[dict]) -> list[dict]:
    """What `rldojo sft` trains on, read back from a JSON line."""
    return text_messages(json.loads(json.dumps(messages)), "demos.jsonl", 1)


def test_openai_messages_carry_tool_calls_and_read_back_to_the_same_text():
    messages = _demo(SEARCH, f"Two more.\n{SEARCH}\n{GET}", "<answer>done</answer>")
    out = openai_messages(messages)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "assistant",
                                        "tool", "tool", "assistant"]  # fmt: skip
    assert out[2] == {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_0_0", "type": "function",
        "function": {"name": "search", "arguments": '{"query": "Ember"}'},
    }]}  # fmt: skip
    assert out[4]["content"] == "Two more."  # the text outside the calls
    assert [c["id"] for c in out[4]["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert json.loads(out[4]["tool_calls"][1]["function"]["arguments"]) == {"id": 7, "full": True}
    assert [m.get("tool_call_id") for m in out[3:7]] == ["call_0_0", None, "call_1_0", "call_1_1"]
    assert out[5]["content"] == "<tool_response>0</tool_response>"  # as the env wrote it
    assert out[7] == {"role": "assistant", "content": "<answer>done</answer>"}
    assert _as_text(out) == messages


@pytest.mark.parametrize(
    ("turn", "results"),
    [
        (f"First {SEARCH} then the rest", 1),  # a call amid prose
        (f"{SEARCH} {GET}", 2),  # calls not one a line
        ('<tool_call>{"name":"search","arguments":{"query":"Ember"}}</tool_call>', 1),  # spacing
        (f"<tool_call>[{SEARCH[11:-12]}, {GET[11:-12]}]</tool_call>", 2),  # two calls, one tag
        (f"<tool_call>{{bad</tool_call>\n{SEARCH}", 2),  # a broken tag and its error
        (SEARCH, 0),  # a call no result answers
    ],
)
def test_a_turn_openai_cannot_give_back_exactly_stays_text(turn, results):
    messages = _demo(turn, "<answer>done</answer>", results=results)
    out = openai_messages(messages)
    assert out[2] == {"role": "assistant", "content": turn}
    assert all("tool_call_id" not in m for m in out)  # its results stay text too
    assert _as_text(out) == messages


def test_a_final_turn_that_calls_keeps_its_calls_without_results():
    out = openai_messages(_demo(SEARCH, GET))  # cut at max_turns: the last turn calls
    assert out[-1]["tool_calls"][0]["id"] == "call_1_0" and out[-2]["tool_call_id"] == "call_0_0"


def test_openai_record_is_messages_and_tools_only():
    record = {"env": "crm-v1", "task_id": "t", "messages": _demo(SEARCH, "<answer>x</answer>"),
              "tools": TOOLS, "passed": True, "score": 1.0}  # fmt: skip
    assert set(openai_record(record)) == {"messages", "tools"}
    assert openai_record({**record, "tools": None}).keys() == {"messages"}
