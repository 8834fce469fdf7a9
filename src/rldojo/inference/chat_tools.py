"""OpenAI `tools` on /v1/chat/completions: schemas into the prompt, tool calls out of the reply.

In: the request's function schemas go through the tokenizer's chat template, as the
environments' ``schema_style="template"`` does, when the template renders tools (it
mentions ``tools``: Qwen, Llama 3, Hermes). A template that ignores them (SmolLM2's)
would drop them silently, so then they are listed in the system prompt instead, in the
syntax rldojo's environments teach (``<tools>`` JSON lines, calls in ``<tool_call>``
tags, results in ``<tool_response>`` tags; `rldojo.envs.tools.tools_prompt`).

The conversation so far arrives in OpenAI's shape and is turned into plain text messages
the template takes: an assistant message's `tool_calls` become ``<tool_call>`` JSON after
its content, one a line (`assistant_text`: what the model wrote, as the environments'
experts write it; `rldojo sft` reads OpenAI-style demonstrations through it too), a
``tool`` message keeps its content (wrapped in ``<tool_response>`` tags when the template
does not render tool turns itself).

Out: `split_tool_calls` reads the reply with the environments' own parser
(`rldojo.inference.tool_calls.parse_turn`) into OpenAI `tool_calls` (arguments as a JSON
string, as OpenAI sends them) and the content outside the tags.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from rldojo.inference.tool_calls import parse_turn
from rldojo.policy.base import Tokenizer, chat_template_ids
from rldojo.types import Message

__all__ = [
    "TOOL_CALL_OPEN",
    "assistant_text",
    "encode_with_tools",
    "split_tool_calls",
    "template_renders_tools",
    "tool_call_text",
    "tools_system_prompt",
]

TOOL_CALL_OPEN = "<tool_call>"
"""Where a reply's tool calls begin: a stream holds its text back from here on."""

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)


def tool_call_text(name: str, arguments: object) -> str:
    """One call as the model writes it; `arguments` a dict or OpenAI's JSON string."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # kept as the string the client sent
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}</tool_call>"


def assistant_text(content: str | None, calls: Sequence[tuple[str, object]]) -> str:
    """An assistant turn of OpenAI's shape as the model wrote it: its content, then each
    ``(name, arguments)`` call as `tool_call_text`, one a line (`split_tool_calls` reads
    it back)."""
    texts = [tool_call_text(name, arguments) for name, arguments in calls]
    return "\n".join([content, *texts] if content else texts)


def tools_system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The system-prompt section listing `tools` for a template that does not render them."""
    body = "\n".join(json.dumps(t, separators=(",", ":"), ensure_ascii=False) for t in tools)
    return (
        f"You can call tools. Available tools:\n<tools>\n{body}\n</tools>\n"
        'To call a tool, write <tool_call>{"name": "<tool name>", "arguments": '
        "{<arguments>}}</tool_call>; each result comes back in "
        "<tool_response>...</tool_response>."
    )


def template_renders_tools(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's chat template uses the `tools` it is given."""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one, or a tool_use one
        template = " ".join(str(t) for t in template.values())
    return isinstance(template, str) and "tools" in template


def _with_tools_listed(messages: list[Message], tools: Sequence[dict[str, Any]]) -> list[Message]:
    """`messages` for a template that ignores tools: the tools listed in the system
    prompt (appended to the first system message, or a new one), tool results wrapped."""
    section = tools_system_prompt(tools)
    out = [
        {**m, "content": f"<tool_response>{m.get('content', '')}</tool_response>"}
        if m.get("role") == "tool"
        else dict(m)
        for m in messages
    ]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content', '')}\n\n{section}"
        return out
    return [{"role": "system", "content": section}, *out]


def encode_with_tools(
    tokenizer: Tokenizer, messages: Sequence[Message], tools: Sequence[dict[str, Any]]
) -> list[int]:
    """Prompt token ids of a conversation offering `tools` (none: the plain template)."""
    if not tools:
        return chat_template_ids(tokenizer, messages)
    if template_renders_tools(tokenizer):
        return chat_template_ids(tokenizer, messages, tools)
    return chat_template_ids(tokenizer, _with_tools_listed(list(messages), tools))


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """A reply as OpenAI's message: its content outside the ``<tool_call>`` tags (None
    when nothing but whitespace is left) and its readable calls as `tool_calls`. A tag the
    parser cannot read stays in the content, so nothing the model wrote is lost."""
    parsed = parse_turn(text, max_calls=64)
    if not parsed.calls:
        return text, []
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": c.name,
                "arguments": json.dumps(c.arguments, ensure_ascii=False),
            },
        }
        for c in parsed.calls
    ]
    broken = {e.raw for e in parsed.errors if e.raw}
    content = _TOOL_CALL_BLOCK.sub(
        lambda m: m.group(0) if _body(m.group(0)) in broken else "", text
    )
    return (content if content.strip() else None), calls


def _body(block: str) -> str:
    return block.removeprefix(TOOL_CALL_OPEN).removesuffix("</tool_call>")
