"""verifiers-v1: environments written against verifiers' public classes, run and graded
by rldojo (`rldojo.envs.verifiers`).

The two environments live in `tests/envs/verifiers_envs/`: a single-turn addition task
with an `XMLParser` and a two-function weighted `Rubric`, and a `ToolEnv` with a Python
tool. The tests that load them need verifiers (its own venv, `make test-verifiers`) and
skip without it; the config checks run everywhere.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from rldojo.envs.registry import EnvKwargsError, build_env, check_kwargs
from rldojo.envs.verifiers.env import ENV_ID, VerifiersEnv
from rldojo.types import Message, Rollout, Task

HERE = Path(__file__).parent / "verifiers_envs"
MATH = str(HERE / "vf_math_single.py")
TOOL = str(HERE / "vf_python_tool.py")
CALL = '<tool_call>{"name": "evaluate", "arguments": {"expression": "17 * 23"}}</tool_call>'


def _needs_verifiers() -> Any:
    vf = pytest.importorskip("verifiers", reason="the verifiers extra: make test-verifiers")
    if not hasattr(vf, "SingleTurnEnv"):
        pytest.skip("verifiers without its classic API (>= 0.4)")
    return vf


# ------------------------------------------------------------ config time (no verifiers)


def test_an_unknown_module_is_one_config_line_naming_it():
    with pytest.raises(EnvKwargsError) as err:
        check_kwargs(ENV_ID, VerifiersEnv, {"module": "no_such_vf_env"})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("env.kwargs.module: verifiers-v1:")
    assert "'no_such_vf_env'" in message
    with pytest.raises(EnvKwargsError, match="no such file"):
        check_kwargs(ENV_ID, VerifiersEnv, {"module": "nowhere/vf_env.py"})
    with pytest.raises(EnvKwargsError, match="env_argz"):
        check_kwargs(ENV_ID, VerifiersEnv, {"module": MATH, "env_argz": {}})


# ------------------------------------------------------------ with verifiers


def _env(module: str = MATH, **kwargs: Any) -> VerifiersEnv:
    _needs_verifiers()
    env = build_env(ENV_ID, VerifiersEnv, {"module": module, **kwargs})
    assert isinstance(env, VerifiersEnv)
    return env


async def _play(env: VerifiersEnv, task: Task, actions: list[str]) -> Rollout:
    """An episode with scripted policy turns, as the rollout engine records it."""
    obs = await env.reset(task, seed=0)
    messages: list[Message] = list(obs.messages)
    info: dict[str, Any] = {}
    for action in actions:
        messages.append({"role": "assistant", "content": action})
        result = await env.step(action)
        messages.extend(result.messages)
        info.update(result.info)
        if result.done:
            break
    return Rollout(task_id=task.id, env=task.env, messages=messages,
                   completion=actions[-1], info=info)  # fmt: skip


def _grade(env: VerifiersEnv, task: Task, actions: list[str]):
    async def run():
        rollout = await _play(env, task, actions)
        return rollout, await env.default_grader().grade(rollout, task)

    return asyncio.run(run())


@pytest.mark.slow
def test_tasks_come_from_the_dataset_and_the_eval_dataset():
    env = _env()
    train = env.tasks("train", seed=3)
    assert sorted(int(t.answer or 0) for t in train) == [2, 5, 9, 14, 17, 18]
    assert [t.id for t in train] == [t.id for t in env.tasks("train", seed=3)]
    assert len(env.tasks("train", seed=3, n=2)) == 2
    test = env.tasks("test")
    assert sorted(t.answer or "" for t in test) == ["17", "42"]
    first = train[0]
    assert first.env == ENV_ID and first.id.startswith("verifiers-v1/vf_math_single/train/")
    assert first.prompt[0] == {  # type: ignore[index]
        "role": "system",
        "content": "Add the numbers. Reply with <answer>...</answer>.",
    }


@pytest.mark.slow
def test_a_module_name_loads_the_way_verifiers_finds_it(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    env = _env("vf-math-single", env_args={"num_examples": 2})  # '-' read as '_'
    assert len(env.tasks("train")) == 2
    sys.modules.pop("vf_math_single", None)


@pytest.mark.slow
def test_a_correct_answer_scores_as_the_rubric_computes_it():
    from rldojo.envs.verifiers.episode import finished_state

    env = _env()
    task = env.tasks("train")[0]
    action = f"<answer>{task.answer}</answer>"
    rollout, score = _grade(env, task, [action])
    assert score.ok
    assert score.components["correct_answer"] == 1.0
    assert score.provenance["weights"] == {
        "correct_answer": 1.0,
        "format_reward_func": 0.2,
        "num_turns": 0.0,
    }
    expected = 1.0 + 0.2 * score.components["format_reward_func"]
    assert score.value == pytest.approx(expected)

    async def verifiers_own() -> Any:  # the same state scored by verifiers' Rubric
        state = await finished_state(env.vf_env, task, rollout)
        await env.vf_env.rubric.score_rollout(state)
        return state

    state = asyncio.run(verifiers_own())
    assert state["reward"] == pytest.approx(score.value)
    assert state["metrics"] == pytest.approx(dict(score.components))
    assert state["completion"][0].content == action  # the policy's text, unchanged


@pytest.mark.slow
def test_a_wrong_answer_keeps_the_format_reward_only():
    env = _env()
    task = env.tasks("train")[0]
    _, score = _grade(env, task, ["<answer>-1</answer>"])
    assert score.ok and score.components["correct_answer"] == 0.0
    assert score.value == pytest.approx(0.2 * score.components["format_reward_func"])


@pytest.mark.slow
def test_the_tool_env_runs_a_tool_call_through_step():
    env = _env(TOOL)
    task = next(t for t in env.tasks("train") if t.answer == "391")

    async def run():
        obs = await env.reset(task, seed=0)
        first = await env.step(CALL)
        last = await env.step("391")
        return obs, first, last

    obs, first, last = asyncio.run(run())
    assert obs.info["tools"][0]["function"]["name"] == "evaluate"
    assert "<tool_call>" in obs.messages[0]["content"]  # listed with rldojo's syntax
    assert first.messages == [{"role": "tool", "content": "391"}] and not first.done
    assert last.done and last.info["verifiers/stop_condition"] == "no_tools_called"
    _, score = _grade(env, task, [CALL, "391"])
    assert score.ok and score.value == pytest.approx(1.1)
    assert score.components["evaluate_calls"] == 1.0
    assert score.components["total_tool_calls"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fail", "status", "words"),
    [("raise", "error", "exploding raised ZeroDivisionError"),
     ("nan", "error", "not_a_number returned nan"),
     ("hang", "timeout", "hanging took longer than 0.2s"),
     ("hang_sync", "timeout", "hanging_sync took longer than 0.2s")],
)  # fmt: skip
def test_a_failing_reward_function_is_a_status_never_zero(fail, status, words):
    env = _env(env_args={"fail": fail}, reward_timeout_s=0.2)
    task = env.tasks("train")[0]
    _, score = _grade(env, task, [f"<answer>{task.answer}</answer>"])
    assert score.status == status and score.value is None
    assert words in score.explanation


@pytest.mark.slow
def test_a_group_reward_function_is_refused_when_built():
    with pytest.raises(EnvKwargsError, match="group reward function 'group_reward'"):
        _env(env_args={"fail": "group"})
