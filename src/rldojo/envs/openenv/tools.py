"""MCP tool environments for `openenv-v1`: an OpenEnv server whose action is OpenEnv's
`CallToolAction` (an `MCPEnvironment`, served with ``create_app(..., CallToolAction,
CallToolObservation)``) is played with rldojo's ``<tool_call>`` protocol.

- **tools**: at reset the environment sends ``{"type": "list_tools"}`` on the episode's
  session; the server's `ListToolsObservation` (name, description, `input_schema` per tool)
  becomes rldojo `Tool`s (`listed_tools`): the system prompt lists them in rldojo's syntax
  (`rldojo.envs.tools.tools_prompt`) and `Observation.info["tools"]` holds them in OpenAI's
  function format, for chat templates with tool support.
- **a turn** is read by `rldojo.envs.tool_calls.parse_turn`; each call is sent, in order,
  as ``{"type": "call_tool", "tool_name", "arguments"}`` (`ToolTurns.play`), and each
  `CallToolObservation` comes back as one ``tool`` message
  (``<tool_response>{"name", "result" | "error"}</tool_response>``, `ToolResult.message`).
  The server checks the arguments; a call to a tool it did not list is refused here.
- **errors** of a tool are messages, never a crash: the server's `ToolError` kinds map to
  rldojo's counters (`tool_not_found` → ``unknown_tool``, `invalid_args` →
  ``bad_arguments``, `execution_error` or a result with ``is_error`` → ``tool_error``,
  `timeout` / `transport_error` → ``exception``). A connection that fails or a reply later
  than `message_timeout_s` still raises (`env_error`, `timeout`).
- **the end**: the server's ``done`` on any call ends the episode (the turn's later calls
  are not sent); an ``<answer>`` ends it after the turn's calls; a turn with neither a call
  nor an answer gets a reminder. The counters are `rldojo.envs.multiturn`'s info keys.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

from rldojo.envs.tool_calls import ERROR_KINDS, PROTOCOL_ERRORS, ToolCall, parse_turn
from rldojo.envs.tools import Tool, ToolResult
from rldojo.types import Message

__all__ = ["ToolTurns", "call_payload", "listed_tools", "tool_result"]

LIST_TOOLS: dict[str, Any] = {"type": "list_tools"}
"""OpenEnv's `ListToolsAction` on the wire."""
_ERROR_KINDS = {
    "tool_not_found": "unknown_tool",
    "invalid_args": "bad_arguments",
    "execution_error": "tool_error",
    "timeout": "exception",
    "transport_error": "exception",
}
"""OpenEnv's `ToolErrorType` → rldojo's `ErrorKind`."""
NUDGE = ("No tool call or final answer found. Call a tool with <tool_call>...</tool_call> "
         "or reply with <answer>...</answer>.")  # fmt: skip

Send = Callable[[dict[str, Any]], Awaitable[tuple[Mapping[str, Any], bool]]]
"""Sends one action on the episode's session: (the observation, the server's done)."""


def _served(**_: object) -> NoReturn:
    raise RuntimeError("an MCP tool runs on the OpenEnv server, not in this process")


def listed_tools(observation: Mapping[str, Any]) -> list[Tool]:
    """The tools of a `ListToolsObservation` as rldojo `Tool`s (their schema is the
    server's `input_schema`; calling one here raises: the server runs it)."""
    tools = []
    for spec in observation.get("tools") or ():
        schema = dict(spec.get("input_schema") or spec.get("inputSchema") or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        tools.append(Tool(str(spec["name"]), str(spec.get("description") or ""), schema, _served))
    return tools


def call_payload(call: ToolCall) -> dict[str, Any]:
    """One parsed call as OpenEnv's `CallToolAction` on the wire."""
    return {"type": "call_tool", "tool_name": call.name, "arguments": dict(call.arguments)}


def _content(result: object) -> object:
    """What a tool returned: the text of a FastMCP `CallToolResult` (its ``content``
    items), else its ``data``, else the value as sent."""
    if not isinstance(result, Mapping):
        return result
    items = result.get("content")
    if isinstance(items, list) and items:
        texts = [i.get("text") if i.get("type") == "text" else i for i in items]
        return texts[0] if len(texts) == 1 else texts
    if "data" in result or "structured_content" in result:
        return result.get("data", result.get("structured_content"))
    return dict(result)


def tool_result(name: str, observation: Mapping[str, Any]) -> ToolResult:
    """A `CallToolObservation` as a `ToolResult` (module docstring: error kinds)."""
    error = observation.get("error")
    if isinstance(error, Mapping):
        kind = _ERROR_KINDS.get(str(error.get("error_type")), "exception")
        return ToolResult(name, False, str(error.get("message") or error), kind)  # type: ignore[arg-type]
    result = observation.get("result")
    if "tool_name" not in observation:  # not a tool observation: show all of it
        return ToolResult(name, True, {k: v for k, v in observation.items() if k != "metadata"})
    if isinstance(result, Mapping) and (result.get("is_error") or result.get("isError")):
        return ToolResult(name, False, _content(result), "tool_error")
    return ToolResult(name, True, _content(result))


class ToolTurns:
    """The tool loop of one episode on an MCP server, and its counters (module docstring)."""

    def __init__(self, tools: Sequence[Tool], *, max_calls: int, max_result_chars: int) -> None:
        self.names = {t.name for t in tools}
        self.max_calls, self.max_result_chars = max_calls, max_result_chars
        self.counts: dict[str, int] = {}
        self.by_name: dict[str, int] = {}
        self.answer: str | None = None

    def _bump(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    async def play(self, text: str, send: Send) -> tuple[list[Message], str | None]:
        """Run one assistant turn: its messages, and why the episode ended (``server``,
        ``answer``) or None."""
        parsed = parse_turn(text, max_calls=self.max_calls)
        messages: list[Message] = []
        for error in parsed.errors:
            self._bump(error.kind)
            self._bump("errors")
            body = json.dumps({"error": error.kind, "message": error.message})
            messages.append({"role": "tool", "content": f"<tool_response>{body}</tool_response>"})
        for call in parsed.calls:
            done = False
            if self.names and call.name not in self.names:
                known = ", ".join(sorted(self.names))
                result = ToolResult(
                    call.name,
                    False,
                    f"unknown tool {call.name!r}; available: {known}",
                    "unknown_tool",
                )
            else:
                observation, done = await send(call_payload(call))
                result = tool_result(call.name, observation)
            self._count(result)
            messages.append(result.message(self.max_result_chars))
            if done:
                return messages, "server"
        if parsed.answer is not None:
            self.answer = parsed.answer
            return messages, "answer"
        if not parsed.calls and not parsed.errors:
            self._bump("format/no_action")
            messages.append({"role": "user", "content": NUDGE})
        return messages, None

    def _count(self, result: ToolResult) -> None:
        if result.ok:
            self._bump("calls")
            self.by_name[result.name] = self.by_name.get(result.name, 0) + 1
        else:
            self._bump(result.error_kind or "exception")
            self._bump("errors")

    def info(self) -> dict[str, Any]:
        """The running totals (`rldojo.envs.multiturn`'s info keys)."""
        return {
            "answer": self.answer,
            "tool/calls": self.counts.get("calls", 0),
            "tool/errors": self.counts.get("errors", 0),
            "format/protocol_errors": sum(self.counts.get(k, 0) for k in PROTOCOL_ERRORS),
            "format/no_action": self.counts.get("format/no_action", 0),
            **{f"tool/{kind}": self.counts.get(kind, 0) for kind in ERROR_KINDS},
            "tool/by_name": dict(self.by_name),
        }
