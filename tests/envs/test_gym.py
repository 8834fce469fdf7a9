"""The Gymnasium adapter: gymnasium's own check_env on every built-in, rewards, registration."""

from __future__ import annotations

import sys
import types
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from rldojo.envs.base import EpisodeDone
from rldojo.envs.gym import CHARSET, register_gymnasium, render_messages, to_gymnasium
from rldojo.envs.registry import list_envs


@pytest.fixture
def reasoning_gym_or_stand_in(monkeypatch):
    """The optional reasoning-gym package, or a small stand-in with its interface."""
    try:
        import reasoning_gym  # noqa: F401
    except ImportError:
        module = types.ModuleType("reasoning_gym")

        class Data(list):
            def score_answer(self, answer, entry):
                return float(answer == entry["answer"])

        def create_dataset(name, *, seed, size, **config):
            return Data(
                {"question": f"{seed} + {i}?", "answer": str(seed + i)} for i in range(size)
            )

        module.create_dataset = create_dataset  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "reasoning_gym", module)


@pytest.mark.slow  # code envs grade in the sandbox
@pytest.mark.parametrize("env_id", list_envs())
def test_gymnasium_check_env_passes_for_every_builtin(
    env_id, builtin_kwargs, reasoning_gym_or_stand_in
):
    env = to_gymnasium(env_id, n_tasks=8, **builtin_kwargs(env_id))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*alternative render modes.*")
        check_env(env)
    env.close()
    env.close()  # closing twice is allowed


def test_episode_reward_arrives_at_the_end():
    env = to_gymnasium("tictactoe-v1", opponent_depth=0, render_mode="ansi")
    obs, info = env.reset(seed=0, options={"task_index": 0})
    assert "tic-tac-toe" in obs and info["messages"][0]["role"] == "user"
    total, steps = 0.0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        legal = obs.split("Legal moves: ")[-1].rstrip(".").split(", ")
        obs, reward, terminated, truncated, info = env.step(f"<move>{legal[0]}</move>")
        total += reward
        steps += 1
    assert info["game/outcome"] in ("win", "loss", "draw")
    assert (
        info["score_status"] == "ok"
        and total == {"win": 1.0, "draw": 0.5, "loss": 0.0}[info["game/outcome"]]
    )
    assert "[assistant]" in env.render()
    with pytest.raises(EpisodeDone):
        env.step("<move>1</move>")
    env.close()


def test_turn_limit_is_truncation():
    env = to_gymnasium("arith-tools-v1", python="off", limits={"max_turns": 2})
    env.reset(seed=1)
    _, reward, terminated, truncated, _ = env.step("thinking")
    assert (terminated, truncated) == (False, False)
    _, reward, terminated, truncated, info = env.step("still thinking")
    assert (terminated, truncated) == (False, True) and info["episode/limit"] == "turns"
    assert reward == pytest.approx(-0.2)  # no answer: the format penalty


def test_observations_stay_in_the_charset():
    text = render_messages([{"role": "user", "content": "naïve ✓ café\x00"}])
    assert set(text) <= CHARSET and "na?ve ? caf??" in text


def test_registered_with_gymnasium_make():
    ids = register_gymnasium()
    assert "rldojo/tictactoe-v1" in ids and "rldojo/crm-v1" in ids
    env = gymnasium.make("rldojo/tictactoe-v1", render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, str)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env.unwrapped)
    env.close()
