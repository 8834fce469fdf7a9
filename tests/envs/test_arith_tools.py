"""arith-tools-v1: exact calculator, sandboxed python (gated), tasks and the tool-use reward."""

from __future__ import annotations

import asyncio
import json

import pytest

from rldojo.envs.arith_tools import ArithToolsEnv
from rldojo.envs.arith_tools import env as arith_tools_env
from rldojo.envs.arith_tools.env import SandboxUnavailableError, calculate, sandbox_status
from rldojo.envs.tools import ToolError
from rldojo.types import Rollout, Task


def run(coro):
    return asyncio.run(coro)


def call(tool: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("123456789012345 * 987654321098765", str(123456789012345 * 987654321098765)),
        ("2^100 - 1", str(2**100 - 1)),
        ("(7 + 5) // 5 + 17 % 5", "4"),
        ("1/3 + 1/6", "1/2 (about 0.5)"),
        ("0.1 + 0.2", "3/10 (about 0.3)"),  # exact, not 0.30000000000000004
        ("gcd(12, 18) * lcm(4, 6) + isqrt(99) + factorial(5) + abs(-3)", str(6 * 12 + 9 + 120 + 3)),
        ("2 ** -2", "1/4 (about 0.25)"),
        ("1_000 * 3", "3000"),
    ],
)
def test_calculator_is_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("9 ** 9 ** 9", "too large"),
        ("factorial(100000)", "too large"),
        ("__import__('os')", "unknown function"),
        ("x + 1", "unsupported syntax"),
        ("2 ** 0.5", "whole-number exponents"),
        ("1 +", "cannot parse"),
        ("1e999 * 2", "cannot evaluate"),
        ("(" * 500 + "1" + ")" * 500, "nested too deeply|cannot parse"),
    ],
)
def test_calculator_refuses_cleanly(expression, message):
    with pytest.raises(ToolError, match=message):
        calculate(expression)


def test_tasks_need_tools_and_are_deterministic():
    env = ArithToolsEnv(python="off")
    tasks = env.tasks("train", seed=0, n=40)
    assert tasks == env.tasks("train", seed=0, n=40)
    assert {t.info["level"] for t in tasks} == {1, 2, 3, 4}
    assert min(len(t.answer) for t in tasks) >= 10  # nobody does these in their head
    test_prompts = {t.prompt for t in env.tasks("test", seed=0, n=40)}
    assert test_prompts.isdisjoint(t.prompt for t in tasks)
    level1 = next(t for t in tasks if t.info["level"] == 1)
    a, b = level1.prompt.removeprefix("What is ").removesuffix("?").split(" * ")
    assert int(a) * int(b) == int(level1.answer)


def episode(env: ArithToolsEnv, task: Task, actions: list[str]) -> tuple[dict, list[dict]]:
    obs = run(env.reset(task, seed=0))
    info, messages = {}, list(obs.messages)
    for action in actions:
        step = run(env.step(action))
        info.update(step.info)
        messages += step.messages
        if step.done:
            break
    return info, messages


def grade(env: ArithToolsEnv, task: Task, info: dict):
    return run(env.default_grader().grade(Rollout(task.id, task.env, [], "", info=info), task))


def test_scripted_calculator_episode_earns_the_reward():
    env = ArithToolsEnv(levels=(1,), python="off")
    task = env.tasks("train", n=1)[0]
    expression = task.prompt.removeprefix("What is ").removesuffix("?")
    info, messages = episode(env, task, [call("calculator", expression=expression), "I have it."])
    assert task.answer in messages[-2]["content"]  # the tool result the model sees
    assert "No tool call" in messages[-1]["content"]
    info, _ = episode(
        env, task, [call("calculator", expression=expression), f"<answer>{task.answer}</answer>"]
    )
    score = grade(env, task, info)
    assert score.value == pytest.approx(1.0 + 0.1 - 0.02)  # correct + tags - one call
    assert score.components["correct"] == 1.0 and score.components["tags"] == 1.0
    # Over-use costs: the same answer after four redundant calls earns less.
    many = [call("calculator", expression=expression)] * 4 + [f"<answer>{task.answer}</answer>"]
    assert grade(env, task, episode(env, task, many)[0]).value == pytest.approx(1.1 - 0.08)
    wrong = grade(env, task, episode(env, task, ["<answer>12</answer>"])[0])
    assert wrong.value == pytest.approx(0.1) and wrong.components["correct"] == 0.0
    # The format shown in the system prompt, copied literally, is no answer: no tag bonus.
    placeholder = grade(env, task, episode(env, task, ["<answer>...</answer>"])[0])
    assert placeholder.value == pytest.approx(0.0) and placeholder.components["tags"] == 0.0
    silent = grade(env, task, episode(env, task, ["hmm"] * 6)[0])
    assert silent.value == pytest.approx(-0.2) and silent.components["format"] == 0.0


def test_reward_terms_are_configurable():
    env = ArithToolsEnv(levels=(1,), python="off", reward={"tag_reward": 0.0, "tool_cost": 0.5})
    task = env.tasks("train", n=1)[0]
    expression = task.prompt.removeprefix("What is ").removesuffix("?")
    info, _ = episode(
        env, task, [call("calculator", expression=expression), f"<answer>{task.answer}</answer>"]
    )
    assert grade(env, task, info).value == pytest.approx(0.5)


def test_python_tool_is_gated(monkeypatch):
    monkeypatch.setattr(arith_tools_env, "sandbox_status", lambda: (False, "no bubblewrap here"))
    with pytest.raises(SandboxUnavailableError, match="no bubblewrap here"):
        ArithToolsEnv(python="on")
    auto = ArithToolsEnv(python="auto")
    assert list(auto.toolbox.tools) == ["calculator"]
    with pytest.raises(ValueError, match="no tools"):
        ArithToolsEnv(python="off", calculator=False)


@pytest.mark.slow  # the sandbox
def test_python_tool_runs_in_the_sandbox():
    if not sandbox_status()[0]:
        pytest.skip(f"sandbox unavailable: {sandbox_status()[1]}")
    env = ArithToolsEnv(levels=(4,), python="on", calculator=False)
    task = env.tasks("train", n=1)[0]
    assert list(env.toolbox.tools) == ["python"]
    code = "import os\nprint(sum(range(10**6)))\nprint(os.getuid())"
    info, messages = episode(env, task, [call("python", code=code)])
    body = json.loads(
        messages[-1]["content"].removeprefix("<tool_response>").removesuffix("</tool_response>")
    )
    assert body["result"]["stdout"].splitlines()[0] == str(sum(range(10**6)))
    assert body["result"]["stdout"].splitlines()[1] != "0"  # not root inside
    crash = episode(env, task, [call("python", code="raise SystemExit(3)")])[1][-1]["content"]
    assert '"returncode": 3' in crash
    assert info["tool/calls"] == 1
