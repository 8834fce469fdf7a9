"""Demonstrations in OpenAI's tool-calling shape: what `rldojo demos --format openai`
writes, for OpenAI's fine-tuning and TRL's `SFTTrainer` (a conversational dataset whose
`tools` column goes to the chat template).

`openai_record` turns a demo record (`rldojo.rollout.demos`) into ``{"messages",
"tools"}`` only, the keys OpenAI's fine-tuning takes: each assistant turn's calls as
`tool_calls` (ids ``call_<turn>_<k>``, arguments a JSON string) and the text outside them
as its content (null when there is none), each result a ``tool`` message naming its call's
id, its content as the env wrote it.

A turn is converted only where `rldojo.inference.chat_tools.assistant_text` (how `rldojo
sft` and `rldojo serve` write `tool_calls` back as text) gives back its exact text and one
``tool`` message answers each call; any other turn (a call amid prose, a broken tag, calls
not one a line) stays text, with its results, so the model trains on the same tokens from
either file (`rldojo.training.demo_data` reads both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rldojo.inference.chat_tools import TOOL_CALL_OPEN, assistant_text, split_tool_calls
from rldojo.types import Message

__all__ = ["openai_messages", "openai_record"]


def openai_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A demo record as one line of OpenAI's fine-tuning format: its messages in OpenAI's
    tool-calling shape (`openai_messages`) and its tools, if any (module docstring)."""
    row: dict[str, Any] = {"messages": openai_messages(record["messages"])}
    if record.get("tools"):
        row["tools"] = record["tools"]
    return row


def openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """`messages` with each assistant turn's calls as `tool_calls` and each ``tool``
    message after it naming its call, where the turn's text comes back exactly; the
    other turns, and their results, stay as they are."""
    out: list[dict[str, Any]] = []
    ids: list[str] = []  # the calls of the last assistant turn not yet answered
    turn = 0
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role == "assistant":
            results = _results(messages, i)
            message = _with_tool_calls(content, turn, results, last=i == len(messages) - 1)
            ids = [call["id"] for call in message.get("tool_calls", ())]
            out.append(message)
            turn += 1
        elif role == "tool" and ids:
            out.append({"role": "tool", "tool_call_id": ids.pop(0), "content": content})
        else:
            out.append({"role": role, "content": content})
    return out


def _results(messages: Sequence[Message], i: int) -> int:
    """How many ``tool`` messages answer assistant turn `i` (up to the next turn)."""
    n = 0
    for m in messages[i + 1 :]:
        if m["role"] == "assistant":
            break
        n += m["role"] == "tool"
    return n


def _with_tool_calls(text: str, turn: int, results: int, *, last: bool) -> dict[str, Any]:
    """One assistant turn in OpenAI's shape, or as text where that would not give back
    `text` exactly, or would leave a result without its call (or a call without its
    result, except in the final turn, whose results are not recorded)."""
    content, calls = split_tool_calls(text)
    content = content or ""
    if not calls or TOOL_CALL_OPEN in content or (results != len(calls) and not last):
        return {"role": "assistant", "content": text}
    pairs = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    # the line break before each call is assistant_text's, not the content's
    for candidate in dict.fromkeys((content.removesuffix("\n" * len(calls)), content)):
        if assistant_text(candidate, pairs) == text:
            numbered = [{**c, "id": f"call_{turn}_{k}"} for k, c in enumerate(calls)]
            return {"role": "assistant", "content": candidate or None, "tool_calls": numbered}
    return {"role": "assistant", "content": text}
