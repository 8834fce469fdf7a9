"""OpenEnv out: rldojo's environments served by `rldojo env serve` (OpenEnv's server
classes), played by OpenEnv's own client (`GenericEnvClient`), never by ours."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys

import httpx
import pytest
from openenv.core import GenericEnvClient

from rldojo.envs.experts import expert_for
from rldojo.envs.registry import make_env
from rldojo.interop.openenv_server import start_env_server
from rldojo.interop.served_episode import ServedEnvSpec
from rldojo.types import Rollout, Score

pytestmark = pytest.mark.slow  # servers


def play(url: str, turns: list[str], **reset: object) -> list:
    """Reset with `reset`, then step each turn; every result, through OpenEnv's client."""

    async def go() -> list:
        async with GenericEnvClient(base_url=url) as client:
            results = [await client.reset(**reset)]
            for turn in turns:
                results.append(await client.step({"message": turn}))
            return results

    return asyncio.run(go())


def test_openenv_client_plays_arith_and_gets_the_graders_reward(arith_server):
    task = make_env("arith-v1").tasks("train")[7]
    opening, right = play(arith_server, [f"Answer: {task.answer}"], index=7)
    assert opening.observation["task_id"] == task.id and opening.reward is None
    assert not opening.done
    assert opening.observation["messages"][-1] == {"role": "user", "content": task.prompt}
    assert right.done and right.reward == 1.0 and right.observation["status"] == "ok"
    assert right.observation["score"]["components"] == {"correct": 1.0, "format": 1.0}
    _, wrong = play(arith_server, [f"Answer: {int(task.answer) + 1}"], index=7)
    assert wrong.done and wrong.reward == 0.0 and wrong.observation["status"] == "ok"
    _, unformatted = play(arith_server, ["no idea"], index=7)
    assert unformatted.reward == -0.5  # arith-v1's format penalty, as in process


def test_a_seed_picks_a_task_and_a_callers_task_is_played(arith_server):
    tasks = make_env("arith-v1").tasks("train")
    (opening,) = play(arith_server, [], seed=len(tasks) + 3)
    assert opening.observation["task_id"] == tasks[3].id
    own = {"id": "mine", "prompt": "What is 2 + 2?", "answer": "4"}
    _, result = play(arith_server, ["Answer: 4"], task=own)
    assert result.reward == 1.0 and result.observation["task_id"] == "mine"


def test_requests_outside_an_episode_are_statuses_not_rewards(arith_server):
    (bad,) = play(arith_server, [], split="train", index=10**6)
    assert bad.done and bad.reward is None and bad.observation["status"] == "invalid"

    async def go() -> list:
        async with GenericEnvClient(base_url=arith_server) as client:
            early = await client.step({"message": "Answer: 1"})
            await client.reset(index=0)
            await client.step({"message": "Answer: 1"})
            late = await client.step({"message": "Answer: 1"})
            return [early, late, await client.state()]

    early, late, state = asyncio.run(go())
    for result in (early, late):
        assert result.done and result.reward is None
        assert result.observation["status"] == "env_error" and result.observation["error"]
    assert state["env_id"] == "arith-v1" and state["turns"] == 1 and state["done"]


def test_tictactoe_served_reward_equals_the_in_process_grade():
    """The expert plays tictactoe-v1 through OpenEnv's client; the same seed and moves
    in process give the same grade."""
    expert = expert_for("tictactoe-v1")
    env = make_env("tictactoe-v1")
    task = env.tasks("train")[2]

    async def served(url: str) -> tuple[list[dict], object]:
        async with GenericEnvClient(base_url=url) as client:
            result = await client.reset(index=2, seed=5)
            messages = list(result.observation["messages"])
            while not result.done:
                move = expert.act(messages, task)
                messages.append({"role": "assistant", "content": move})
                result = await client.step({"message": move})
                messages += result.observation["messages"]
            return messages, result

    async def in_process(moves: list[str]) -> Score:
        obs = await env.reset(task, seed=5)
        info: dict = {}
        for move in moves:
            step = await env.step(move)
            info.update(step.info)
        rollout = Rollout(task.id, task.env, obs.messages, moves[-1], info=info)
        return await env.default_grader().grade(rollout, task)

    with start_env_server(ServedEnvSpec("tictactoe-v1")) as handle:
        messages, last = asyncio.run(served(handle.url))
    moves = [m["content"] for m in messages if m["role"] == "assistant"]
    expected = asyncio.run(in_process(moves))
    assert last.observation["status"] == "ok" and last.reward in (0.5, 1.0)
    assert last.reward == expected.value


def test_the_crm_expert_solves_served_crm_v1_through_openenvs_client():
    kwargs = {"db_size": "small", "n_databases": 1}
    expert, tasks = expert_for("crm-v1", **kwargs), make_env("crm-v1", **kwargs).tasks("train")

    async def solve(url: str, index: int) -> object:
        async with GenericEnvClient(base_url=url) as client:
            result = await client.reset(index=index, seed=0)
            messages = list(result.observation["messages"])
            while not result.done:
                turn = expert.act(messages, tasks[index])
                messages.append({"role": "assistant", "content": turn})
                result = await client.step({"message": turn})
                messages += result.observation["messages"]
            return result

    with start_env_server(ServedEnvSpec("crm-v1", kwargs)) as handle:
        results = [asyncio.run(solve(handle.url, i)) for i in range(2)]
    for result in results:
        assert result.observation["status"] == "ok" and result.reward == 1.0
        assert result.observation["score"]["components"]["tool_calls"] >= 1


def test_structured_tool_calls_reach_a_tool_environment():
    with start_env_server(ServedEnvSpec("arith-tools-v1")) as handle:

        async def go() -> tuple:
            async with GenericEnvClient(base_url=handle.url) as client:
                opening = await client.reset(index=0)
                call = {"name": "calculator", "arguments": {"expression": "6 * 7"}}
                return opening, await client.step({"message": "", "tool_calls": [call]})

        opening, reply = asyncio.run(go())
    assert "calculator" in [t["function"]["name"] for t in opening.observation["tools"]]
    assert not reply.done and reply.observation["messages"][0]["role"] == "tool"
    assert "42" in reply.observation["messages"][0]["content"]


@pytest.mark.parametrize(
    ("mode", "status"), [("raise", "env_error"), ("hang", "timeout"), ("grade", "grade_error")]
)
def test_env_and_grader_failures_are_statuses_with_no_reward(broken_env_id, mode, status):
    spec = ServedEnvSpec(broken_env_id, {"mode": mode}, step_timeout_s=0.2)
    with start_env_server(spec) as handle:
        _, result = play(handle.url, ["hello"], index=0)
    assert result.done and result.reward is None
    assert result.observation["status"] == status and result.observation["error"]


def test_the_task_api_lists_tasks_without_answers(arith_server):
    tasks = make_env("arith-v1").tasks("train")
    with httpx.Client(base_url=arith_server, trust_env=False) as http:
        assert http.get("/health").json()["status"] == "healthy"
        splits = http.get("/arith-v1/splits").json()
        assert [s["name"] for s in splits] == ["train", "test"]
        assert http.post("/arith-v1/num_tasks", json={"split": "train"}).json() == {
            "num_tasks": len(tasks)
        }
        task = http.post("/arith-v1/task", json={"split": "train", "index": 4}).json()["task"]
        assert task == {"id": tasks[4].id, "split": "train", "index": 4, "prompt": tasks[4].prompt}
        assert (
            http.post("/arith-v1/task", json={"split": "train", "index": 10**6}).status_code == 400
        )
        schema = http.get("/schema").json()
        assert "message" in schema["action"]["properties"]


def test_rldojo_env_serve_command_serves_until_sigterm():
    process = subprocess.Popen(
        [sys.executable, "-m", "rldojo", "env", "serve", "arith-v1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded by the process: it prints or exits
        found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        assert found, line + (process.stderr.read() if process.stderr else "")
        task = make_env("arith-v1").tasks("train")[0]
        _, result = play(found.group(1), [f"Answer: {task.answer}"], index=0)
        assert result.reward == 1.0
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
