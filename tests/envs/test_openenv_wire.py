"""openenv-v1 without a server: its kwargs, its tasks (reset requests), the mapping of
turns and observations (`rldojo.envs.openenv.wire`) and its grader (the server's rewards;
no reward is `invalid`, never 0)."""

from __future__ import annotations

import asyncio
import json

import pytest

from rldojo.envs.openenv.grader import OpenEnvRewardGrader
from rldojo.envs.openenv.tools import call_payload, listed_tools, tool_result
from rldojo.envs.openenv.wire import (
    ServerReportedError,
    action_field_of,
    check_status,
    is_tool_action,
    observation_messages,
)
from rldojo.envs.registry import EnvKwargsError, make_env
from rldojo.envs.tool_calls import ToolCall
from rldojo.types import Rollout, Task

URL = "http://127.0.0.1:9"


def test_kwargs_are_checked_before_anything_connects():
    with pytest.raises(EnvKwargsError, match=r"env\.kwargs\.base_url"):
        make_env("openenv-v1", base_url="localhost:8000")
    with pytest.raises(EnvKwargsError, match="did you mean 'max_turns'"):
        make_env("openenv-v1", base_url=URL, max_turn=3)
    with pytest.raises(EnvKwargsError, match="exactly one of base_url and path"):
        make_env("openenv-v1")
    with pytest.raises(EnvKwargsError, match="exactly one of base_url and path"):
        make_env("openenv-v1", base_url=URL, path="envs/echo")
    with pytest.raises(EnvKwargsError, match="'auto', 'text' or 'mcp_tools'"):
        make_env("openenv-v1", path="envs/echo", actions="tools")


def test_tasks_are_reset_requests_with_disjoint_seeds():
    env = make_env("openenv-v1", base_url=URL, tasks=3, test_tasks=2, seed=10)
    train, test = env.tasks("train"), env.tasks("test")
    assert [t.info["reset"] for t in train] == [{"seed": 10}, {"seed": 11}, {"seed": 12}]
    assert [t.info["reset"] for t in test] == [{"seed": 13}, {"seed": 14}]
    assert env.tasks("train", seed=5, n=2) == train[:2]  # the kwargs fix the episodes
    api = make_env("openenv-v1", base_url=URL, tasks=2, task_api=True, reset_kwargs={"level": 2})
    assert api.tasks("test")[1].info["reset"] == {"level": 2, "seed": 3, "split": "test",
                                                  "index": 1}  # fmt: skip
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("validation")


def test_the_text_goes_in_the_actions_only_string_field():
    template = {"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}},
                "required": ["message"]}  # fmt: skip
    assert action_field_of(template) == "message"
    two = {"properties": {"code": {"type": "string"}, "lang": {"type": "string"}},
           "required": ["code"]}  # fmt: skip
    assert action_field_of(two) == "code"
    with pytest.raises(ValueError, match="action_field"):
        action_field_of({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}})
    with pytest.raises(ValueError, match="no string field"):
        action_field_of({"properties": {"x": {"type": "integer"}}})


def test_observations_become_messages():
    chat = {"messages": [{"role": "tool", "content": "42"}], "status": "ok", "metadata": {}}
    assert observation_messages(chat) == [{"role": "tool", "content": "42"}]
    assert observation_messages({"text": "your move", "metadata": {}}) == [
        {"role": "user", "content": "your move"}
    ]
    echo = {"echoed_message": "hi", "message_length": 2, "metadata": {"step": 1}}
    (shown,) = observation_messages(echo)
    assert json.loads(shown["content"]) == {"echoed_message": "hi", "message_length": 2}
    assert observation_messages(echo, "echoed_message") == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="no field 'board'"):
        observation_messages(echo, "board")
    mcp_reset = {"metadata": {"question": "Which country is Rome in?"}}  # nothing but metadata
    assert observation_messages(mcp_reset) == [
        {"role": "user", "content": "Which country is Rome in?"}
    ]


CALL_TOOL_ACTION = {  # openenv 0.10.0's CallToolAction schema, as /schema sends it
    "properties": {
        "metadata": {"type": "object"},
        "type": {"const": "call_tool", "default": "call_tool", "type": "string"},
        "tool_name": {"type": "string"},
        "arguments": {"type": "object", "additionalProperties": True},
    },
    "required": ["tool_name"],
}


def test_mcp_tool_servers_are_told_apart_and_their_tools_listed():
    assert is_tool_action(CALL_TOOL_ACTION)
    assert not is_tool_action({"properties": {"message": {"type": "string"}}})
    listed = {"tools": [{"name": "add", "description": "Add.", "input_schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}]}  # fmt: skip
    (add,) = listed_tools(listed)
    assert add.schema()["function"] == {"name": "add", "description": "Add.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": []}}  # fmt: skip
    assert add.signature() == "add(a?: integer) - Add."
    assert call_payload(ToolCall("add", {"a": 1})) == {
        "type": "call_tool", "tool_name": "add", "arguments": {"a": 1}}  # fmt: skip


def test_tool_observations_become_results_and_errors():
    text = {"tool_name": "add", "error": None, "result": {
        "content": [{"type": "text", "text": "3"}], "data": 3, "is_error": False}}  # fmt: skip
    assert tool_result("add", text).message() == {
        "role": "tool",
        "content": '<tool_response>{"name": "add", "result": "3"}</tool_response>',
    }
    kinds = {"tool_not_found": "unknown_tool", "invalid_args": "bad_arguments",
             "execution_error": "tool_error", "timeout": "exception"}  # fmt: skip
    for error_type, kind in kinds.items():
        error = {"error_type": error_type, "message": "no"}
        failed = tool_result("add", {"tool_name": "add", "result": None, "error": error})
        assert not failed.ok and failed.error_kind == kind and failed.content == "no"
    flagged = {"tool_name": "add", "result": {"content": [{"type": "text", "text": "bad a"}],
                                              "is_error": True}}  # fmt: skip
    assert tool_result("add", flagged).error_kind == "tool_error"
    assert tool_result("add", {"tool_name": "add", "result": {"data": [1, 2]}}).content == [1, 2]


def test_reported_failures_raise_and_other_statuses_pass():
    assert check_status({"echoed_message": "hi"}) == "ok"
    assert check_status({"status": "running"}) == "running"  # another server's field
    assert check_status({"status": "grade_error", "error": "x"}) == "grade_error"
    with pytest.raises(ServerReportedError, match="env_error: boom"):
        check_status({"status": "env_error", "error": "boom"})
    with pytest.raises(TimeoutError):
        check_status({"status": "timeout", "error": "slow"})


def grade(info: dict, mode: str = "sum"):
    rollout = Rollout("t", "openenv-v1", [], "", info=info)
    return asyncio.run(OpenEnvRewardGrader(mode).grade(rollout, Task(id="t", prompt="")))


def test_the_score_is_the_servers_rewards_and_never_a_made_up_0():
    assert grade({"openenv/rewards": [None, 0.25, 0.5]}).value == 0.75
    assert grade({"openenv/rewards": [0.25, 0.5, None]}, "last").value == 0.5
    none = grade({"openenv/rewards": [None, None]})
    assert none.status == "invalid" and none.value is None
    failed = grade({"openenv/rewards": [None], "openenv/status": "grade_timeout",
                    "openenv/error": "judge slow"})  # fmt: skip
    assert failed.status == "error" and "judge slow" in failed.explanation
    served = grade({"openenv/rewards": [1.0],
                    "openenv/score": {"components": {"correct": 1.0, "format": 1.0}}})  # fmt: skip
    assert served.components["server/correct"] == 1.0
