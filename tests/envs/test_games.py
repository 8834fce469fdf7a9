"""tictactoe-v1 and connect4-v1: rules, opponent strength, illegal moves, reward, forks."""

from __future__ import annotations

import asyncio
import random

import pytest

from rldojo.envs.base import EpisodeDone
from rldojo.envs.games import Connect4, Connect4Env, GameGrader, TicTacToe, TicTacToeEnv
from rldojo.envs.registry import make_env
from rldojo.types import Rollout, Task


def run(coro):
    return asyncio.run(coro)


def blank_task(env_id: str, mark: str = "X") -> Task:
    return Task(id=f"{env_id}/fixed", prompt="play", info={"mark": mark, "opening": []}, env=env_id)


def play_random(env, task: Task, seed: int, rng: random.Random):
    run(env.reset(task, seed=seed))
    while True:
        step = run(env.step(f"<move>{rng.choice(env.rules.legal(env.state.board))}</move>"))
        if step.done:
            return step


def test_win_detection():
    ttt, c4 = TicTacToe(), Connect4()
    board = list("XX.OO....")
    cell = ttt.play(board, 3, "X")
    assert ttt.wins(board, cell) and ttt.legal(board) == [6, 7, 8, 9]
    board = ["."] * 42
    for _ in range(3):
        c4.play(board, 4, "O")
    assert not c4.wins(board, c4.play(board, 5, "X"))
    assert c4.wins(board, c4.play(board, 4, "O"))  # four in column 4
    for _ in range(2):
        c4.play(board, 4, "X")
    assert 4 not in c4.legal(board)


def test_perfect_opponent_never_loses_and_random_one_does():
    rng = random.Random(0)
    perfect = TicTacToeEnv(opponent_depth=9)
    weak = TicTacToeEnv(opponent_depth=0)
    task = blank_task("tictactoe-v1", mark="O")  # the opponent opens
    perfect_outcomes = {play_random(perfect, task, s, rng).info["game/outcome"] for s in range(12)}
    weak_outcomes = [play_random(weak, task, s, rng).info["game/outcome"] for s in range(30)]
    assert "win" not in perfect_outcomes
    assert "win" in weak_outcomes


def test_deeper_connect4_opponent_is_stronger():
    rng = random.Random(1)
    task = blank_task("connect4-v1")
    losses = {
        depth: sum(
            play_random(Connect4Env(opponent_depth=depth), task, s, rng).info["game/outcome"]
            == "loss"
            for s in range(8)
        )
        for depth in (0, 2)
    }
    assert losses[2] > losses[0] and losses[2] >= 7


def test_illegal_moves_are_refused_counted_then_forfeit():
    env = TicTacToeEnv(max_illegal=3)
    run(env.reset(blank_task("tictactoe-v1"), seed=0))
    step = run(env.step("I pick the middle"))
    assert not step.done and "no <move>N</move> found" in step.messages[0]["content"]
    step = run(env.step("<move>10</move>"))
    assert "10 is not a legal move" in step.messages[0]["content"]
    assert step.info["game/illegal_moves"] == 2
    step = run(env.step("<move>0</move>"))
    assert step.done and step.info["game/outcome"] == "forfeit"
    with pytest.raises(EpisodeDone):
        run(env.step("<move>5</move>"))


def test_reward_by_outcome():
    grader = GameGrader()
    task = blank_task("tictactoe-v1")
    values = {}
    for outcome in ("win", "draw", "loss", "forfeit"):
        info = {"game/outcome": outcome, "game/illegal_moves": 1}
        values[outcome] = run(grader.grade(Rollout(task.id, task.env, [], "", info=info), task))
    assert values["win"].value == pytest.approx(0.9) and values["win"].components["correct"] == 1.0
    assert values["draw"].value == pytest.approx(0.4)
    assert values["loss"].value == pytest.approx(-0.1)
    missing = run(grader.grade(Rollout(task.id, task.env, [], ""), task))
    assert missing.status == "invalid"


def test_scripted_win_against_random_opponent():
    env = make_env("tictactoe-v1")
    won = False
    for seed in range(20):  # X takes the left column unless blocked; a random O often fails
        run(env.reset(blank_task("tictactoe-v1"), seed=seed))
        for move in (1, 4, 7, 2, 3, 5, 6, 8, 9):
            if move not in env.rules.legal(env.state.board):
                continue
            step = run(env.step(f"thinking... <move>{move}</move>"))
            if step.done:
                break
        if step.info["game/outcome"] == "win":
            score = run(
                env.default_grader().grade(
                    Rollout("t", "tictactoe-v1", [], "", info=step.info), blank_task("tictactoe-v1")
                )
            )
            assert score.value == 1.0
            won = True
            break
    assert won


def test_same_seed_replays_and_forks_continue_exactly():
    env = Connect4Env(opponent_depth=1, opponent_epsilon=0.5)
    task = env.tasks("train", seed=3, n=1)[0]
    first = [run(env.reset(task, seed=7)).messages[-1]["content"]]
    first += [run(env.step(f"<move>{m}</move>")).messages[0]["content"] for m in (4, 4, 3)]
    fork_point = env.fork()
    tail = [run(env.step(f"<move>{m}</move>")).info["game/moves"] for m in (5, 6)]
    second = [run(env.reset(task, seed=7)).messages[-1]["content"]]
    second += [run(env.step(f"<move>{m}</move>")).messages[0]["content"] for m in (4, 4, 3)]
    assert first == second
    assert [run(fork_point.step(f"<move>{m}</move>")).info["game/moves"] for m in (5, 6)] == tail


def test_tasks_start_positions_and_opening_move():
    env = TicTacToeEnv()
    tasks = env.tasks("train", seed=0, n=20)
    assert tasks == env.tasks("train", seed=0, n=20)
    task = next(t for t in tasks if t.info["mark"] == "O" and not t.info["opening"])
    obs = run(env.reset(task, seed=1))
    assert sum(v == "X" for v in env.state.board) == 1  # the opponent (X) has opened
    assert (
        "Opponent played" in obs.messages[-1]["content"]
        and "You are O" in obs.messages[-1]["content"]
    )
