"""Reading demonstrations in both forms: calls as ``<tool_call>`` text or as OpenAI's
`tool_calls`, mixed in one file, read to the same text; the OpenAI form's mistakes as
one-line errors naming file, line and field; the example in docs/agentic.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rldojo.data.loading import DataError
from rldojo.training.demo_data import read_demos

SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "Ember"}}</tool_call>'
GET = '<tool_call>{"name": "get", "arguments": {"id": 7}}</tool_call>'
OPENING = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
TEXT = [
    *OPENING,
    {"role": "assistant", "content": f"Looking.\n{SEARCH}\n{GET}"},
    {"role": "tool", "content": "<tool_response>1</tool_response>"},
    {"role": "tool", "content": "<tool_response>2</tool_response>"},
    {"role": "assistant", "content": "<answer>done</answer>"},
]


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


OPENAI = [
    *OPENING,
    {"role": "assistant", "content": "Looking.", "tool_calls": [
        _call("a", "search", '{"query": "Ember"}'), _call("b", "get", '{"id": 7}')]},
    {"role": "tool", "tool_call_id": "a", "content": "<tool_response>1</tool_response>"},
    {"role": "tool", "tool_call_id": "b", "content": "<tool_response>2</tool_response>"},
    {"role": "assistant", "content": "<answer>done</answer>"},
]  # fmt: skip


def _file(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_both_forms_in_one_file_read_to_the_same_text(tmp_path):
    mixed = [*OPENAI[:6], {"role": "assistant", "content": None, "tool_calls": [
        _call("c", "get", '{"id": 7}')]}, {"role": "tool", "content": "3"}]  # fmt: skip
    demos, _ = read_demos(_file(tmp_path, {"messages": TEXT}, {"messages": OPENAI},
                                {"messages": [*mixed, TEXT[-1]]}))  # fmt: skip
    assert demos[0].messages == demos[1].messages == TEXT
    assert demos[2].messages[-3:-1] == [
        {"role": "assistant", "content": GET},  # no content: the call alone
        {"role": "tool", "content": "3"},  # a result without an id is text, as in the first form
    ]


def _with(index: int, **fields) -> list[dict]:
    messages = json.loads(json.dumps(OPENAI))
    messages[index].update(fields)
    return messages


@pytest.mark.parametrize(
    ("messages", "field", "needle"),
    [
        (_with(3, tool_call_id="z"), "messages[3]'.tool_call_id", "'z' matches no call"),
        (_with(2, tool_calls=[_call("a", "search", '{"query": ')]),
         "messages[2]'.tool_calls[0].function.arguments", "not valid JSON (Expecting value"),
        (_with(2, tool_calls=[_call("a", "search", "[1]")]),
         "messages[2]'.tool_calls[0].function.arguments", "expected a JSON object"),
        (_with(2, tool_calls=[{"id": "a", "name": "search"}]),
         "messages[2]'.tool_calls[0].function", 'expected {"name", "arguments"}'),
        (_with(2, tool_calls={"id": "a"}), "messages[2]'.tool_calls", "expected a list"),
        (_with(2, content=None, tool_calls=[]), "messages[2]'.content", "expected str"),
        (_with(1, tool_calls=[_call("a", "search", "{}")]), "messages[1]'.tool_calls",
         "only assistant turns make calls"),
        # a result names a call of the turn just before it, not of an earlier one
        ([*OPENAI[:4], {"role": "assistant", "content": "Hm."},
          {"role": "tool", "tool_call_id": "b", "content": "2"}, OPENAI[-1]],
         "messages[5]'.tool_call_id", "'b' matches no call"),
    ],
)  # fmt: skip
def test_openai_mistakes_are_one_line_naming_file_line_and_field(tmp_path, messages, field, needle):
    path = _file(tmp_path, {"messages": TEXT}, {"messages": messages})
    with pytest.raises(DataError) as info:
        read_demos(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: field '{field}: ") and needle in message, message
    assert "\n" not in message


def test_the_example_in_the_docs_reads(tmp_path):
    page = (Path(__file__).resolve().parents[2] / "docs" / "agentic.md").read_text()
    (block,) = re.findall(r"^```json\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    (demo,), _ = read_demos(_file(tmp_path, json.loads(block)))
    call = '<tool_call>{"name": "search_accounts", "arguments": {"query": "Crest Logistics"}}'
    assert demo.messages[2] == {"role": "assistant", "content": f"{call}</tool_call>"}
    assert demo.tools is not None and demo.tools[0]["function"]["name"] == "search_accounts"
