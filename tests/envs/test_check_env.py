"""check_env and `rldojo check-env`: every built-in passes, a broken environment fails clearly.

Also covers the reasoning-gym adapter, with a small stand-in for the optional package.
"""

from __future__ import annotations

import sys
import textwrap
import types

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.envs.check import check_env
from rldojo.envs.registry import list_envs, make_env
from rldojo.types import Rollout

runner = CliRunner()

BROKEN = textwrap.dedent(
    '''
    """A user's environment with three classic bugs."""
    import json
    import random

    from rldojo.graders.composite import answer_reward
    from rldojo.types import Observation, StepResult, Task


    class BrokenEnv:
        env_id = "broken-v1"

        def tasks(self, split="train", *, seed=0, n=None):
            return [Task(id=f"b/{i}", prompt="Say hi", answer="hi") for i in range(n or 2)]

        async def reset(self, task, *, seed):
            self.turns = 0
            mood = random.random()  # unseeded: a different opening every time
            text = f"({mood:.6f}) {task.prompt}"
            return Observation(messages=[{"role": "user", "content": text}])

        async def step(self, action):
            self.turns += 1
            if "<tool_call>" in action:  # parses tool calls without any error handling
                json.loads(action.split("<tool_call>")[1].split("</tool_call>")[0])
            return StepResult(messages=[], done=self.turns >= 1)  # never refuses after done

        async def close(self):
            pass

        def default_grader(self):
            return answer_reward()


    def make_broken():
        return BrokenEnv()
    '''
)


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    (tmp_path / "my_broken_envs.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_broken_envs:make_broken"
    sys.modules.pop("my_broken_envs", None)


class FakeDataset(list):
    """The part of reasoning-gym's ProceduralDataset the adapter uses."""

    def score_answer(self, answer, entry):
        return 1.0 if answer == entry["answer"] else 0.01


@pytest.fixture
def fake_reasoning_gym(monkeypatch):
    module = types.ModuleType("reasoning_gym")

    def create_dataset(name, *, seed, size, **config):
        step = config.get("step", 1)
        return FakeDataset(
            {
                "question": f"What is {seed % 97} + {i * step}?",
                "answer": str(seed % 97 + i * step),
                "metadata": {},
            }
            for i in range(size)
        )

    module.create_dataset = create_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "reasoning_gym", module)
    return module


@pytest.mark.parametrize("env_id", list_envs())
@pytest.mark.slow
def test_every_builtin_passes(env_id, builtin_kwargs, fake_reasoning_gym):
    report = check_env(env_id, **builtin_kwargs(env_id))
    assert report.ok, str(report)
    assert [r.name for r in report.results] == [
        "construct",
        "tasks",
        "reset",
        "step",
        "bad_actions",
        "step_after_done",
        "snapshot",
        "grader",
        "close",
    ]


@pytest.mark.slow
def test_broken_env_fails_with_clear_messages(broken_module):
    report = check_env(broken_module)
    assert not report.ok
    failed = {r.name: r.message for r in report.failures}
    assert set(failed) == {"reset", "bad_actions", "step_after_done"}
    assert "same task and seed gave different openings" in failed["reset"]
    assert (
        "raised JSONDecodeError" in failed["bad_actions"]
        and "error observation" in failed["bad_actions"]
    )
    assert "instead of raising EpisodeDone" in failed["step_after_done"]
    with pytest.raises(AssertionError, match="FAIL"):
        report.raise_for_failures()


@pytest.mark.slow
def test_cli_check_env(broken_module):
    good = runner.invoke(app, ["check-env", "tictactoe-v1"])
    assert good.exit_code == 0, good.output
    assert "check-env tictactoe-v1: PASS" in good.output
    bad = runner.invoke(app, ["check-env", broken_module])
    assert bad.exit_code == 1
    assert "FAIL reset: same task and seed gave different openings" in bad.output
    assert "FAIL" in bad.output.splitlines()[-1]
    unknown = runner.invoke(app, ["check-env", "nope-v1"])
    assert unknown.exit_code == 2 and "unknown environment 'nope-v1'" in unknown.output
    kwargs = runner.invoke(
        app, ["check-env", "crm-v1", "--kwargs", '{"db_size": "small", "levels": [1]}']
    )
    assert kwargs.exit_code == 0, kwargs.output
    assert runner.invoke(app, ["check-env", "crm-v1", "--kwargs", "{oops"]).exit_code == 2


def test_reasoning_gym_adapter(fake_reasoning_gym):
    import asyncio

    env = make_env("reasoning-gym-v1", dataset="chain_sum", config={"step": 2})
    train, test = env.tasks("train", seed=5, n=3), env.tasks("test", seed=5, n=3)
    assert train[1].prompt.startswith("What is 5 + 2?") and train[1].answer == "7"
    assert {t.prompt for t in train}.isdisjoint(t.prompt for t in test)
    grader = env.default_grader()

    def score(text):
        return asyncio.run(grader.grade(Rollout(train[1].id, env.env_id, [], text), train[1]))

    assert score("It is <answer>7</answer>").value == 1.0
    assert score("Answer: 8").value == 0.01
    assert score("no idea").components["format"] == 0.0


@pytest.fixture
def reasoning_gym_registry(monkeypatch):
    """reasoning-gym's dataset registry, `factory.DATASETS`: the real package's when it is
    installed, else a stand-in of the same shape (name -> (dataset class, config class))."""
    try:
        import reasoning_gym
    except ImportError:
        import dataclasses

        @dataclasses.dataclass
        class ChainSumConfig:
            min_terms: int = 2
            max_terms: int = 6
            seed: int | None = None
            size: int = 500

        reasoning_gym = types.ModuleType("reasoning_gym")
        registry = {"chain_sum": (list, ChainSumConfig), "leg_counting": (list, object)}
        reasoning_gym.factory = types.SimpleNamespace(DATASETS=registry)  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "reasoning_gym", reasoning_gym)
    return reasoning_gym.factory.DATASETS


@pytest.mark.slow
def test_reasoning_gym_unknown_dataset_or_config_key_names_the_key(reasoning_gym_registry):
    from rldojo.envs.registry import EnvKwargsError

    assert "chain_sum" in reasoning_gym_registry
    with pytest.raises(EnvKwargsError) as info:
        make_env("reasoning-gym-v1", dataset="chain_sumx")
    assert str(info.value) == ("env.kwargs.dataset: reasoning-gym has no dataset 'chain_sumx' "
                               "(did you mean 'chain_sum'?)")  # fmt: skip
    with pytest.raises(EnvKwargsError, match=r"^env.kwargs.config.min_term: reasoning-gym's "
                       r"chain_sum takes no 'min_term' \(did you mean 'min_terms'\?\); it "
                       r"takes: min_terms, max_terms"):  # fmt: skip
        make_env("reasoning-gym-v1", dataset="chain_sum", config={"min_term": 3})
    with pytest.raises(EnvKwargsError, match="takes no 'seed'"):  # the env seeds each split
        make_env("reasoning-gym-v1", dataset="chain_sum", config={"seed": 3})


def test_reasoning_gym_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        make_env("reasoning-gym-v1")
