"""Tools of multi-turn environments: typed functions, their schemas, and dispatch.

A `Tool` is a typed Python function: its name, docstring (first paragraph, plus the
``Args:`` section for per-parameter text) and annotated parameters give the JSON schema
shown to the model (`tools_prompt`, and `Tool.schema()` in the OpenAI function format for
chat templates with tool support). `ToolBox.call` validates arguments against the schema
and runs the function; it never raises: unknown tools, bad arguments, `ToolError`s (the
realistic validation errors of an API) and unexpected exceptions all come back as a
`ToolResult` with ``ok=False`` and an `error_kind` that the environment counts.

The calls themselves are read from a policy turn by `rldojo.envs.tool_calls.parse_turn`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from rldojo.envs.tool_calls import ErrorKind, ToolCall

__all__ = [
    "Tool",
    "ToolBox",
    "ToolError",
    "ToolResult",
    "tool",
    "tools_prompt",
]


class ToolError(Exception):
    """Raised by a tool to refuse a request; the message is shown to the model."""


@dataclass(frozen=True)
class ToolResult:
    name: str
    ok: bool
    content: object
    """What the tool returned (JSON-able; other values are sent as their `str`), or why it
    failed."""
    error_kind: ErrorKind | None = None

    def message(self, max_chars: int = 4000) -> dict[str, str]:
        """The environment message that carries this result to the policy."""
        key = "result" if self.ok else "error"
        body = json.dumps({"name": self.name, key: self.content}, default=str)
        if len(body) > max_chars:
            body = body[:max_chars] + f"... [truncated {len(body) - max_chars} chars]"
        return {"role": "tool", "content": f"<tool_response>{body}</tool_response>"}


# ------------------------------------------------------------------ schemas from functions


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: text}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    head, _, rest = doc.partition("\nArgs:\n")
    description = " ".join(head.split("\n\n")[0].split())
    params: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        if line and not line.startswith(" "):
            break  # the next section (Returns:, Raises:)
        match = re.match(r"^\s{2,8}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
    return description, params


def _type_schema(tp: object) -> dict[str, Any]:
    """JSON schema of a Python annotation (str, int, float, bool, list, dict, Literal, Optional)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp in (inspect.Parameter.empty, Any):
        return {}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _type_schema(options[0])
        return {"anyOf": [_type_schema(a) for a in options]}
    if origin is Literal:
        values = list(args)
        kinds = {type(v) for v in values}
        schema: dict[str, Any] = {"enum": values}
        if len(kinds) == 1:
            schema.update(_type_schema(kinds.pop()))
        return schema
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    if tp in (list, tuple) or origin in (list, tuple, Sequence, Iterable):
        items = _type_schema(args[0]) if args else {}
        return {"type": "array", "items": items} if items else {"type": "array"}
    if tp is dict or origin in (dict, Mapping):
        return {"type": "object"}
    raise TypeError(f"unsupported tool parameter annotation: {tp!r}")


def _check(value: object, schema: Mapping[str, Any], where: str) -> str | None:
    """Why `value` does not fit `schema` (None when it does)."""
    if "anyOf" in schema:
        if all(_check(value, s, where) for s in schema["anyOf"]):
            return f"{where}: {value!r} matches none of the allowed types"
        return None
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"{where}: must be one of {allowed}, got {json.dumps(value, default=str)}"
    kind = schema.get("type")
    checks: dict[str, Callable[[object], bool]] = {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if kind in checks and not checks[kind](value):
        got = "null" if value is None else type(value).__name__
        return f"{where}: expected {kind}, got {got} {json.dumps(value, default=str)[:40]}"
    if kind == "array" and "items" in schema and isinstance(value, list):
        for i, item in enumerate(value):
            if problem := _check(item, schema["items"], f"{where}[{i}]"):
                return problem
    return None


@dataclass(frozen=True)
class Tool:
    """A callable the policy may use, with the JSON schema of its parameters.

    `fn` is called with keyword arguments (sync or async); it returns anything
    JSON-serialisable, or raises `ToolError` to refuse with a message for the model.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = field(repr=False, compare=False)

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> Tool:
        """Build a tool from a typed function (bound methods drop `self`)."""
        hints = typing.get_type_hints(fn)
        doc, param_docs = _docstring_parts(fn.__doc__ or "")
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {fn.__name__}: *args/**kwargs are not supported")
            schema = _type_schema(hints.get(pname, param.annotation))
            if pname in param_docs:
                schema["description"] = param_docs[pname]
            properties[pname] = schema
            if param.default is param.empty:
                required.append(pname)
        parameters = {"type": "object", "properties": properties, "required": required}
        return cls(name or fn.__name__, description or doc, parameters, fn)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool format used by chat templates."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def signature(self) -> str:
        """A one-line summary: ``name(a: string, b?: integer) - description``."""
        props, required = self.parameters["properties"], set(self.parameters["required"])
        parts = []
        for pname, schema in props.items():
            kind = "|".join(map(str, schema.get("enum", []))) or schema.get("type", "any")
            parts.append(f"{pname}{'' if pname in required else '?'}: {kind}")
        return f"{self.name}({', '.join(parts)}) - {self.description}"

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments, checked against the schema; raises ToolError saying what is wrong."""
        props, required = self.parameters["properties"], self.parameters["required"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolError(
                f"unexpected argument(s) {', '.join(unknown)}; "
                f"{self.name} takes: {', '.join(props) or 'no arguments'}"
            )
        missing = [p for p in required if p not in arguments]
        if missing:
            raise ToolError(f"missing required argument(s): {', '.join(missing)}")
        for pname, value in arguments.items():
            if value is None and pname not in required:
                continue  # explicit null for an optional parameter means "not given"
            if problem := _check(value, props[pname], pname):
                raise ToolError(problem)
        return {k: v for k, v in arguments.items() if not (v is None and k not in required)}


def tool(fn: Callable[..., Any]) -> Tool:
    """Decorator: ``@tool def add(a: int, b: int) -> int: "Add two integers."``."""
    return Tool.from_function(fn)


# ------------------------------------------------------------------ dispatch


class ToolBox:
    """The tools of one episode, by name; `call` runs one call and never raises.

    Args:
        tools: the tools (names must be unique).
        timeout_s: limit of one async tool call (sync tools must bound themselves).
    """

    def __init__(self, tools: Iterable[Tool], *, timeout_s: float = 30.0) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self.tools[t.name] = t
        self.timeout_s = timeout_s

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    async def call(self, call: ToolCall) -> ToolResult:
        spec = self.tools.get(call.name)
        if spec is None:
            known = ", ".join(self.tools) or "(none)"
            return ToolResult(
                call.name, False, f"unknown tool {call.name!r}; available: {known}", "unknown_tool"
            )
        try:
            arguments = spec.validate(call.arguments)
        except ToolError as exc:
            return ToolResult(call.name, False, f"bad arguments: {exc}", "bad_arguments")
        try:
            out = spec.fn(**arguments)
            if inspect.isawaitable(out):
                out = await asyncio.wait_for(_awaitable(out), self.timeout_s)
        except ToolError as exc:
            return ToolResult(call.name, False, str(exc), "tool_error")
        except TimeoutError:
            return ToolResult(call.name, False, f"timed out after {self.timeout_s:g}s", "exception")
        except Exception as exc:  # a crashing tool is an observation, not a crashed episode
            return ToolResult(
                call.name, False, f"internal error: {type(exc).__name__}: {exc}", "exception"
            )
        return ToolResult(call.name, True, out)


async def _awaitable(value: Awaitable[Any]) -> Any:
    return await value


def tools_prompt(
    tools: Iterable[Tool], *, style: Literal["json", "signatures", "template"] = "json"
) -> str:
    """The system-prompt section that lists the tools and the call/answer syntax.

    ``template`` leaves the list out, for chat templates that render the tools themselves.
    """
    listed = list(tools)
    if style == "json":
        body = "\n".join(json.dumps(t.schema(), separators=(",", ":")) for t in listed)
    else:
        body = "\n".join(f"- {t.signature()}" for t in listed)
    available = "" if style == "template" else f"Available tools:\n<tools>\n{body}\n</tools>\n"
    return (
        f"You can call tools. {available}To call a tool, write "
        '<tool_call>{"name": "<tool name>", "arguments": {<arguments>}}</tool_call>; '
        "each result comes back in <tool_response>...</tool_response>. "
        "When you are done, write your final reply to the user in <answer>...</answer>."
    )
