"""The tool-call protocol of multi-turn environments, as environments import it.

The parser itself (`parse_turn`, `ToolCall`, `ProtocolError`, ...) lives in
`rldojo.inference.tool_calls`, a layer below the environments, because `rldojo serve`
reads the same ``<tool_call>`` tags from a model's reply into OpenAI `tool_calls`: one
parser, so a served model and an environment agree on what a tool call is.
"""

from __future__ import annotations

from rldojo.inference.tool_calls import (
    ERROR_KINDS,
    MAX_CALL_CHARS,
    PROTOCOL_ERRORS,
    ErrorKind,
    ParsedTurn,
    ProtocolError,
    ToolCall,
    parse_turn,
)

__all__ = [
    "ERROR_KINDS",
    "MAX_CALL_CHARS",
    "PROTOCOL_ERRORS",
    "ErrorKind",
    "ParsedTurn",
    "ProtocolError",
    "ToolCall",
    "parse_turn",
]
