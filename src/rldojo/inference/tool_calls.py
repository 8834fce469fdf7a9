"""The ``<tool_call>`` protocol: reading tool calls from a model's turn.

A turn is free text that may contain tool calls and a final answer:

    I'll look the deal up first.
    <tool_call>{"name": "get_deal", "arguments": {"deal_id": "DEAL-0007"}}</tool_call>
    ...
    <answer>The deal is in negotiation.</answer>

`parse_turn` reads a turn robustly: JSON inside ``<tool_call>`` tags (markdown fences,
surrounding prose, Python-literal quoting, an ``arguments`` value given as a JSON string,
a list of calls in one tag, and a final unclosed tag are all accepted); everything it
cannot read becomes a `ProtocolError` with a message the model can act on.

Two readers share it: multi-turn environments (`rldojo.envs.multiturn`, whose tools
`rldojo.envs.tools.ToolBox` runs) and `rldojo serve`, which turns the calls of a reply into
OpenAI `tool_calls` (`rldojo.inference.chat_tools`). It lives here, below both layers, so
the two agree on what a tool call is.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

from rldojo import pyast

__all__ = [
    "ErrorKind",
    "ParsedTurn",
    "ProtocolError",
    "ToolCall",
    "parse_turn",
]

ErrorKind = Literal[
    "malformed", "unknown_tool", "bad_arguments", "too_many_calls", "tool_error", "exception"
]
"""`malformed`, `unknown_tool`, `bad_arguments`, `too_many_calls`: the policy broke the
protocol (format penalty). `tool_error`: the tool refused the request (a validation error
of the simulated API; no penalty). `exception`: the tool crashed or timed out (our fault)."""

ERROR_KINDS: tuple[str, ...] = typing.get_args(ErrorKind)
PROTOCOL_ERRORS: frozenset[str] = frozenset(
    {"malformed", "unknown_tool", "bad_arguments", "too_many_calls"}
)
MAX_CALL_CHARS = 20_000
"""A ``<tool_call>`` body longer than this is refused unparsed (bounded parsing cost)."""

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    raw: str = ""


@dataclass(frozen=True)
class ProtocolError:
    kind: ErrorKind
    message: str
    raw: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """What a policy turn asked for: tool calls in order, parse errors, the final answer."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ProtocolError, ...] = ()
    answer: str | None = None


def _decode(body: str) -> Any:
    """JSON, else a Python literal, else the outermost {...} / [...] of the body."""
    body = _FENCE.sub("", body.strip()).strip()
    candidates = [body]
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if starts:
        start = min(starts)
        end = max(body.rfind("}"), body.rfind("]"))
        if end > start and (start, end) != (0, len(body) - 1):
            candidates.append(body[start : end + 1])
    for text in candidates:
        try:
            return json.loads(text)
        except ValueError:
            pass
        try:
            return pyast.literal_eval(text)  # single quotes, True/None; literals only
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    raise ValueError("not valid JSON")


def _as_call(obj: object, raw: str) -> ToolCall | ProtocolError:
    shape = 'expected {"name": "<tool>", "arguments": {...}}'
    if not isinstance(obj, dict):
        return ProtocolError("malformed", f"tool call is a {type(obj).__name__}; {shape}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ProtocolError("malformed", f'tool call has no "name"; {shape}', raw)
    args = obj.get("arguments", obj.get("args", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return ProtocolError("malformed", f'"arguments" of {name} is not valid JSON', raw)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ProtocolError("malformed", f'"arguments" of {name} must be an object; {shape}', raw)
    return ToolCall(name.strip(), args, raw)


def parse_turn(text: str, *, max_calls: int = 8) -> ParsedTurn:
    """Tool calls, protocol errors and the final answer in one policy turn (never raises)."""
    calls: list[ToolCall] = []
    errors: list[ProtocolError] = []
    for match in _TOOL_CALL.finditer(text):
        raw = match.group(1)
        if len(raw) > MAX_CALL_CHARS:
            errors.append(ProtocolError("malformed", "tool call too long", raw[:200]))
            continue
        try:
            decoded = _decode(raw)
        except ValueError:
            snippet = " ".join(raw.split())[:120]
            errors.append(
                ProtocolError("malformed", f"could not parse tool call JSON: {snippet!r}", raw)
            )
            continue
        for obj in decoded if isinstance(decoded, list) else [decoded]:
            parsed = _as_call(obj, raw)
            if isinstance(parsed, ToolCall):
                calls.append(parsed)
            else:
                errors.append(parsed)
    if len(calls) > max_calls:
        extra = len(calls) - max_calls
        errors.append(
            ProtocolError("too_many_calls", f"at most {max_calls} calls per turn; {extra} ignored")
        )
        calls = calls[:max_calls]
    answers = _ANSWER.findall(text)
    answer = answers[-1].strip() if answers else None
    if answer is None and "<answer>" in text:
        errors.append(ProtocolError("malformed", "<answer> is not closed with </answer>"))
    return ParsedTurn(tuple(calls), tuple(errors), answer)
