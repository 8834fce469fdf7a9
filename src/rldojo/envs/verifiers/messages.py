"""Messages across the verifiers boundary: verifiers' pydantic messages and rldojo's dicts.

rldojo's policy writes text, and the rollout engine keeps the exact token ids of that
text; so a policy turn reaches verifiers as an `AssistantMessage` whose content is the
text unchanged. When the environment has tools, the ``<tool_call>{...}</tool_call>``
blocks in it (read by `rldojo.envs.tool_calls.parse_turn`, the parser `rldojo serve`
uses too) become the message's `tool_calls`, with ids ``call_<turn>_<k>``; verifiers'
tool messages come back as ``tool`` messages with their content unchanged, and are paired
with those ids again in order when a finished conversation is rebuilt for grading.

Only text content crosses: a message with image or audio parts is refused (ValueError).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

from rldojo.envs.tool_calls import parse_turn
from rldojo.types import Message

__all__ = [
    "ENV_ID",
    "assistant_message",
    "prompt_messages",
    "text_of",
    "to_rldojo",
    "to_vf",
    "tool_schemas",
    "tools_section",
]

ENV_ID = "verifiers-v1"


def _field(message: object, key: str) -> object:
    """A message field, from a dict (dataset rows) or a pydantic message."""
    return message.get(key) if isinstance(message, Mapping) else getattr(message, key, None)


def text_of(content: object) -> str:
    """A message's content as text: a string, or the text of its ``text`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Iterable):
        raise ValueError(f"{ENV_ID}: a message's content is text or parts, got {content!r}")
    texts = []
    for part in content:
        kind = _field(part, "type")
        if kind != "text":
            raise ValueError(f"{ENV_ID}: only text messages cross to rldojo, got a {kind!r} part")
        texts.append(str(_field(part, "text") or ""))
    return "".join(texts)


def to_rldojo(messages: Iterable[Any]) -> list[Message]:
    """verifiers' messages (or dataset rows' dicts) as rldojo's ``{role, content}``."""
    return [
        {"role": str(_field(m, "role")), "content": text_of(_field(m, "content"))} for m in messages
    ]


prompt_messages = to_rldojo
"""A dataset row's prompt as the task's prompt."""


def assistant_message(vf: ModuleType, text: str, turn: int, *, tools: bool) -> tuple[Any, int]:
    """`(AssistantMessage, protocol errors)` for one policy turn: the text unchanged and,
    with `tools`, its tool calls (malformed ones are counted, not passed on)."""
    if not tools:
        return vf.AssistantMessage(content=text), 0
    parsed = parse_turn(text)
    calls = [
        vf.ToolCall(id=f"call_{turn}_{k}", name=call.name, arguments=json.dumps(call.arguments))
        for k, call in enumerate(parsed.calls)
    ]
    return vf.AssistantMessage(content=text, tool_calls=calls or None), len(parsed.errors)


def to_vf(vf: ModuleType, messages: Sequence[Message], *, tools: bool) -> list[Any]:
    """rldojo's messages after the prompt as verifiers' messages: assistant turns with
    their tool calls, tool messages paired in order with the calls before them."""
    out: list[Any] = []
    pending: list[str] = []
    turn = 0
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "assistant":
            assistant, _ = assistant_message(vf, content, turn, tools=tools)
            pending = [call.id for call in assistant.tool_calls or ()]
            turn += 1
            out.append(assistant)
        elif role == "tool":
            call_id = pending.pop(0) if pending else f"call_{turn - 1}_unpaired"
            out.append(vf.ToolMessage(content=content, tool_call_id=call_id))
        elif role == "system":
            out.append(vf.SystemMessage(content=content))
        else:
            out.append(vf.UserMessage(content=content))
    return out


def tool_schemas(tool_defs: Iterable[Any]) -> list[dict[str, Any]]:
    """verifiers' tool definitions as OpenAI function schemas (`Observation.info["tools"]`,
    for chat templates that render tools)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            },
        }
        for t in tool_defs
    ]


def tools_section(tool_defs: Iterable[Any]) -> str:
    """The system-prompt section that lists the tools and the call syntax (the same
    ``<tool_call>`` syntax as rldojo's own tool environments)."""
    body = "\n".join(
        json.dumps(s["function"], separators=(",", ":")) for s in tool_schemas(tool_defs)
    )
    return (
        f"You can call tools. Available tools:\n<tools>\n{body}\n</tools>\nTo call a tool, "
        'write <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>; '
        "each result comes back in a tool message."
    )
