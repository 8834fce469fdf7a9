"""OpenEnv in, MCP tools: `openenv-v1` plays an OpenEnv MCP tool environment with rldojo's
``<tool_call>`` protocol (tools listed at reset, each call a `call_tool` action, each
result a tool message, tool errors as messages), on a server it starts from the
environment's directory (`path`).

openenv 0.10.0 ships no MCP tool environment that runs without outside services (its
`HarborEnvironment` needs Harbor sandboxes; `openenv init`'s template takes text), so the
environment here is a minimal one written on openenv's public classes: an
`MCPEnvironment` with two FastMCP tools, served by `create_app(..., CallToolAction,
CallToolObservation)` as openenv's own importer templates serve theirs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from rldojo.envs.openenv.server import shared_server, stop_servers
from rldojo.envs.registry import make_env
from rldojo.types import Rollout

pytestmark = pytest.mark.slow  # a server process

APP = '''
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State

COUNTRIES = {"rome": "Italy", "paris": "France"}


class CapitalsEnvironment(MCPEnvironment):
    """Asks for Rome's country; `submit` ends the episode, reward 1.0 when right."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("capitals")
        self._submitted = None

        @mcp.tool
        def country_of(city: str) -> str:
            """The country a city is in."""
            if city.lower() not in COUNTRIES:
                raise ValueError(f"no city {city!r}")
            return COUNTRIES[city.lower()]

        @mcp.tool
        def submit(answer: str) -> str:
            """Submit the final answer."""
            self._submitted = answer
            return "submitted"

        super().__init__(mcp)
        self._state = State(episode_id="capitals", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._submitted = None
        return Observation(metadata={"question": "Which country is Rome in? Submit it."})

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(metadata={"error": "call a tool"})

    async def step_async(self, action, timeout_s=None, **kwargs):
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if self._submitted is not None:
            observation.done, observation.reward = True, float(self._submitted == "Italy")
        return observation

    @property
    def state(self):
        return self._state


app = create_app(CapitalsEnvironment, CallToolAction, CallToolObservation,
                 env_name="capitals", max_concurrent_envs=4)
'''


@pytest.fixture(scope="module")
def capitals_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MCP environment's directory (``server/app.py``, as `openenv init` lays out)."""
    root = tmp_path_factory.mktemp("capitals_env")
    (root / "server").mkdir()
    (root / "server" / "__init__.py").write_text("")
    (root / "server" / "app.py").write_text(APP)
    return root


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def response(message: dict) -> dict:
    assert message["role"] == "tool"
    return json.loads(message["content"].removeprefix("<tool_response>")
                      .removesuffix("</tool_response>"))  # fmt: skip


async def play(env, turns: list[str]):
    """Reset, play `turns` until done; the opening, the step results and the score."""
    task = env.tasks("train")[0]
    opening = await env.reset(task, seed=0)
    results = []
    for turn in turns:
        results.append(await env.step(turn))
        if results[-1].done:
            break
    rollout = Rollout(task.id, task.env, opening.messages, turns[-1], info=results[-1].info)
    return opening, results, await env.default_grader().grade(rollout, task)


def test_an_mcp_tool_environment_is_played_with_tool_calls(capitals_dir):
    env = make_env("openenv-v1", path=str(capitals_dir))  # actions="auto": the schema says MCP
    turns = [
        "Let me look. " + call("country_of", city="Rome") + call("country_of", city="Oslo"),
        call("capital_of", city="Rome") + "<tool_call>{not json</tool_call>",
        "thinking...",
        call("submit", answer="Italy"),
    ]
    opening, results, score = asyncio.run(play(env, turns))
    system, user = opening.messages
    assert "<tool_call>" in system["content"] and '"name":"country_of"' in system["content"]
    assert user == {"role": "user", "content": "Which country is Rome in? Submit it."}
    names = [t["function"]["name"] for t in opening.info["tools"]]
    assert names == ["country_of", "submit"] and opening.info["tools"][0]["type"] == "function"
    found, missing = map(response, results[0].messages)
    assert found == {"name": "country_of", "result": "Italy"}
    assert "no city 'Oslo'" in missing["error"]  # the tool raised: a message, not a crash
    malformed, unknown = map(response, results[1].messages)  # parse errors first
    assert malformed["error"] == "malformed" and "unknown tool 'capital_of'" in unknown["error"]
    assert results[2].messages[-1]["role"] == "user"  # neither a call nor an answer: a nudge
    last = results[-1]
    assert last.done and last.info["episode/done_reason"] == "server"
    assert last.info["tool/calls"] == 2 and last.info["tool/tool_error"] == 1
    assert last.info["tool/unknown_tool"] == 1 and last.info["format/no_action"] == 1
    assert last.info["openenv/rewards"] == [None, None, 1.0]  # one per call sent
    assert score.ok and score.value == 1.0


def test_an_answer_ends_the_episode_the_server_did_not(capitals_dir):
    env = make_env("openenv-v1", path=str(capitals_dir), actions="mcp_tools", reward="last")
    turns = [call("country_of", city="Paris") + "<answer>France</answer>"]
    _, (last,), score = asyncio.run(play(env, turns))
    assert last.done and last.info["episode/done_reason"] == "answer"
    assert last.info["answer"] == "France" and last.info["tool/calls"] == 1
    assert score.status == "invalid" and score.value is None  # no reward: never a made-up 0


def test_a_server_stopped_mid_episode_raises_env_error(capitals_dir):
    """Last in the file: it stops the shared server (the hook that runs at exit)."""
    env = make_env("openenv-v1", path=str(capitals_dir))
    server = shared_server(capitals_dir)  # the one the other tests played on

    async def go() -> None:
        await env.reset(env.tasks()[0], seed=0)
        stop_servers()  # what runs at exit
        assert not server.alive()
        try:
            with pytest.raises((ConnectionError, ConnectionClosed)):
                await env.step(call("country_of", city="Rome"))
        finally:
            await env.close()

    asyncio.run(go())
