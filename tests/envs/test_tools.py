"""The tool-call protocol: schemas from functions, robust parsing, dispatch, the ToolEnv loop."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from rldojo.envs.base import EpisodeDone
from rldojo.envs.multiturn import EpisodeLimits, ToolEnv, protocol_terms
from rldojo.envs.tool_calls import ToolCall, parse_turn
from rldojo.envs.tools import Tool, ToolBox, ToolError, tool, tools_prompt
from rldojo.types import Task


def run(coro):
    return asyncio.run(coro)


def lookup(
    city: str, units: Literal["metric", "imperial"] = "metric", days: int | None = None
) -> dict:
    """Weather forecast for a city.

    Args:
        city: the city name.
        units: unit system.
        days: how many days (default 1).
    """
    if city == "Atlantis":
        raise ToolError("city not found")
    if city == "Boom":
        raise RuntimeError("database down")
    return {"city": city, "units": units, "days": days or 1}


def test_schema_from_typed_function():
    t = Tool.from_function(lookup)
    assert t.name == "lookup"
    assert t.description == "Weather forecast for a city."
    props = t.parameters["properties"]
    assert props["city"] == {"type": "string", "description": "the city name."}
    assert props["units"]["enum"] == ["metric", "imperial"]
    assert props["days"]["type"] == "integer"
    assert t.parameters["required"] == ["city"]
    schema = t.schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "lookup"
    assert "lookup(city: string, units?: metric|imperial, days?: integer)" in t.signature()


def test_decorator_and_unsupported_annotations():
    @tool
    def add(a: int, b: float = 1.0) -> float:
        """Add."""
        return a + b

    assert add.parameters["properties"]["b"] == {"type": "number"}
    with pytest.raises(TypeError, match="unsupported"):

        def bad(x: set[int]) -> None:
            """Bad."""

        Tool.from_function(bad)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument(s): city"),
        ({"city": "Oslo", "colour": "red"}, "unexpected argument(s) colour"),
        ({"city": 5}, "city: expected string"),
        ({"city": "Oslo", "units": "kelvin"}, 'must be one of "metric", "imperial"'),
        ({"city": "Oslo", "days": True}, "days: expected integer"),
    ],
)
def test_validation_errors_are_readable(arguments, message):
    with pytest.raises(ToolError) as err:
        Tool.from_function(lookup).validate(arguments)
    assert message in str(err.value)


def test_null_for_optional_means_not_given():
    assert Tool.from_function(lookup).validate({"city": "Oslo", "days": None}) == {"city": "Oslo"}


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}</tool_call>',
        '<tool_call>\n```json\n{"name": "lookup", "arguments": {"city": "Oslo"}}\n```\n'
        "</tool_call>",
        "<tool_call>{'name': 'lookup', 'arguments': {'city': 'Oslo'}}</tool_call>",
        '<tool_call>{"name": "lookup", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
        'Sure: <tool_call>call {"name": "lookup", "arguments": {"city": "Oslo"}} now</tool_call>',
        'I will call <tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}',  # cut off
    ],
)
def test_parse_is_robust(text):
    parsed = parse_turn(text)
    assert parsed.errors == ()
    assert parsed.calls == (ToolCall("lookup", {"city": "Oslo"}, parsed.calls[0].raw),)


def test_parse_lists_errors_and_answer():
    text = (
        "<tool_call>{oops</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>[{"name": "a"}, {"name": "b", "arguments": null}]</tool_call>'
        "<answer> 42 </answer>"
    )
    parsed = parse_turn(text)
    assert [c.name for c in parsed.calls] == ["a", "b"]
    assert [e.kind for e in parsed.errors] == ["malformed", "malformed"]
    assert "could not parse" in parsed.errors[0].message
    assert parsed.answer == "42"
    many = parse_turn('<tool_call>{"name": "a"}</tool_call>' * 5, max_calls=2)
    assert len(many.calls) == 2 and many.errors[0].kind == "too_many_calls"
    unclosed = parse_turn("<answer>forgot to close")
    assert unclosed.answer is None and unclosed.errors[0].kind == "malformed"


def test_toolbox_never_raises():
    async def slow() -> str:
        """Sleep."""
        await asyncio.sleep(5)
        return "late"

    box = ToolBox([Tool.from_function(lookup), Tool.from_function(slow)], timeout_s=0.05)
    cases = [
        (ToolCall("lookup", {"city": "Oslo"}), (True, None)),
        (ToolCall("nope", {}), (False, "unknown_tool")),
        (ToolCall("lookup", {"town": "Oslo"}), (False, "bad_arguments")),
        (ToolCall("lookup", {"city": "Atlantis"}), (False, "tool_error")),
        (ToolCall("lookup", {"city": "Boom"}), (False, "exception")),
        (ToolCall("slow", {}), (False, "exception")),
    ]
    for call, (ok, kind) in cases:
        result = run(box.call(call))
        assert (result.ok, result.error_kind) == (ok, kind), call
    message = run(box.call(ToolCall("nope", {}))).message()
    assert message["role"] == "tool" and "available: lookup, slow" in message["content"]
    with pytest.raises(ValueError, match="duplicate"):
        ToolBox([Tool.from_function(lookup), Tool.from_function(lookup)])


def test_tools_prompt_lists_tools_and_syntax():
    tools = [Tool.from_function(lookup)]
    assert '"name":"lookup"' in tools_prompt(tools)
    compact = tools_prompt(tools, style="signatures")
    assert "- lookup(city: string" in compact and "<tool_call>" in compact and "<answer>" in compact
    bare = tools_prompt(tools, style="template")  # the chat template shows the schemas
    assert "lookup" not in bare and "<tool_call>" in bare


class WeatherEnv(ToolEnv):
    env_id = "weather-v1"

    def build_tools(self) -> list[Tool]:
        return [Tool.from_function(lookup)]

    def tasks(self, split="train", *, seed=0, n=None):
        return [Task(id="w/0", prompt="Weather in Oslo?", env=self.env_id)]

    def default_grader(self):
        raise NotImplementedError


def test_tool_env_turns_counters_and_answer():
    env = WeatherEnv()
    obs = run(env.reset(env.tasks()[0], seed=0))
    assert obs.messages[0]["role"] == "system" and "lookup" in obs.messages[0]["content"]
    assert obs.info["tools"][0]["function"]["name"] == "lookup"
    step = run(env.step('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}</tool_call>'))
    assert not step.done and '"city": "Oslo"' in step.messages[0]["content"]
    step = run(env.step("<tool_call>{bad</tool_call><tool_call>{'name': 'x'}</tool_call>"))
    assert [m["role"] for m in step.messages] == ["tool", "tool"]
    assert step.info["tool/malformed"] == 1 and step.info["tool/unknown_tool"] == 1
    step = run(env.step("hmm"))  # neither a call nor an answer: a reminder, counted
    assert "No tool call" in step.messages[-1]["content"] and step.info["format/no_action"] == 1
    step = run(env.step("<answer>Sunny</answer>"))
    assert step.done and step.messages == [] and step.info["answer"] == "Sunny"
    assert step.info["tool/calls"] == 1 and step.info["tool/errors"] == 2
    assert step.info["format/protocol_errors"] == 2
    assert step.info["episode/done_reason"] == "answer" and step.info["episode/turns"] == 4
    with pytest.raises(EpisodeDone):
        run(env.step("again"))
    terms, penalty = protocol_terms(step.info, format_penalty=0.2, error_penalty=0.05)
    assert terms["format"] == 1.0 and penalty == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [({"max_turns": 2}, "turns"), (EpisodeLimits(max_tokens=400), "tokens")],
)
def test_limits_end_the_episode(limits, reason):
    env = WeatherEnv(limits=limits)
    run(env.reset(env.tasks()[0], seed=0))
    results = [run(env.step("word " * 100))]
    while not results[-1].done and len(results) < 5:
        results.append(run(env.step("word " * 100)))
    assert len(results) == 2
    assert results[-1].info["episode/limit"] == reason
    assert results[-1].info["episode/done_reason"] == "limit"


def test_no_action_end_mode_and_fork():
    env = WeatherEnv(no_action="end")
    run(env.reset(env.tasks()[0], seed=0))
    run(env.step('<tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}</tool_call>'))
    child = env.fork()
    assert child.snapshot() == env.snapshot()
    assert run(child.step("no call here")).done  # ends only the child
    assert not env.episode.done and env.episode.turns == 1
