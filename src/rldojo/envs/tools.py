"""The tool-call protocol of multi-turn environments: schemas, parsing, dispatch.

A policy turn is free text that may contain tool calls and a final answer:

    I'll look the deal up first.
    <tool_call>{"name": "get_deal", "arguments": {"deal_id": "DEAL-0007"}}</tool_call>
    ...
    <answer>The deal is in negotiation.</answer>

`parse_turn` reads a turn robustly: JSON inside ``<tool_call>`` tags (markdown fences,
surrounding prose, Python-literal quoting, an ``arguments`` value given as a JSON string,
a list of calls in one tag, and a final unclosed tag are all accepted); everything it
cannot read becomes a `ProtocolError` with a message the model can act on.

A `Tool` is a typed Python function: its name, docstring (first paragraph, plus the
``Args:`` section for per-parameter text) and annotated parameters give the JSON schema
shown to the model (`tools_prompt`, and `Tool.schema()` in the OpenAI function format for
chat templates with tool support). `ToolBox.call` validates arguments against the schema
and runs the function; it never raises: unknown tools, bad arguments, `ToolError`s (the
realistic validation errors of an API) and unexpected exceptions all come back as a
`ToolResult` with ``ok=False`` and an `error_kind` that the environment counts.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

__all__ = [
    "ErrorKind",
    "ParsedTurn",
    "ProtocolError",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "parse_turn",
    "tool",
    "tools_prompt",
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


class ToolError(Exception):
    """Raised by a tool to refuse a request; the message is shown to the model."""


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


@dataclass(frozen=True)
class ToolResult:
    name: str
    ok: bool
    content: Any
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


def _type_schema(tp: Any) -> dict[str, Any]:
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


def _check(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    """Why `value` does not fit `schema` (None when it does)."""
    if "anyOf" in schema:
        if all(_check(value, s, where) for s in schema["anyOf"]):
            return f"{where}: {value!r} matches none of the allowed types"
        return None
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"{where}: must be one of {allowed}, got {json.dumps(value, default=str)}"
    kind = schema.get("type")
    checks: dict[str, Callable[[Any], bool]] = {
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
    if kind == "array" and "items" in schema:
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


# ------------------------------------------------------------------ parsing a policy turn


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
            return ast.literal_eval(text)  # single quotes, True/None; literals only
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    raise ValueError("not valid JSON")


def _as_call(obj: Any, raw: str) -> ToolCall | ProtocolError:
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
            (calls if isinstance(parsed, ToolCall) else errors).append(parsed)  # type: ignore[arg-type]
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
