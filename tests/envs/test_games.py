"""tictactoe-v1 and connect4-v1: rules, opponent strength, illegal moves, reward, forks."""

from __future__ import annotations

import asyncio
import random

import pytest

from rldojo.envs.base import EpisodeDone
from rldojo.envs.games.env import Connect4Env, GameGrader, TicTacToeEnv
from rldojo.envs.games.rules import Connect4, TicTacToe
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


@pytest.mark.slow
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


def played_rollout(env, task: Task, replies: list[str]) -> Rollout:
    """Play `replies` (stopping when the game ends) and build the rollout the engine would:
    per policy turn 3 token ids (mask True), per environment turn 2 (mask False)."""
    run(env.reset(task, seed=0))
    ids, mask = [], []
    for reply in replies:
        step = run(env.step(reply))
        ids += [7, 7, 7]
        mask += [True] * 3
        if step.done:
            break
        ids += [9, 9]
        mask += [False] * 2
    return Rollout(task.id, task.env, [], "", [1], ids, tuple(mask), info=step.info)


def test_move_credit_marks_the_turn_that_missed_a_win():
    # X holds 1 and 2, O holds 4 and 5: cell 3 wins, anything but 3 or 6 lets O win at 6.
    task = Task(id="t/credit", prompt="play", info={"mark": "X", "opening": [1, 4, 2, 5]},
                env="tictactoe-v1")  # fmt: skip
    env = TicTacToeEnv(move_credit=1.0)
    grader = env.default_grader()
    won = played_rollout(env, task, ["<move>3</move>"])
    score = run(grader.grade(won, task))
    values = grader._expert.move_values(["X", "X", ".", "O", "O", ".", ".", ".", "."], "X")
    assert values[3] == 1.0 and values[7] < values[6] < 1.0
    best = 1.0 - sum(values.values()) / len(values)
    assert score.value == 1.0 and score.token_rewards == pytest.approx((best,) * 3)
    assert score.components["move_credit"] == pytest.approx(best)
    # An illegal turn, then 7 (a blunder), then whatever follows: the illegal turn and the
    # environment's tokens get nothing, the blunder its own negative credit.
    blunder = played_rollout(env, task, ["no idea", "<move>7</move>", "<move>6</move>"])
    score = run(grader.grade(blunder, task))
    credits = grader.move_credits(blunder, task)
    assert credits[0] == 0.0 and credits[1] == pytest.approx(values[7] - (1.0 - best))
    assert credits[1] < 0
    rewards = score.token_rewards
    assert rewards[:3] == (0.0, 0.0, 0.0) and rewards[3:5] == (0.0, 0.0)
    assert rewards[5:8] == pytest.approx((credits[1],) * 3)
    with pytest.raises(ValueError, match="move_credit: tictactoe-v1: expected a value greater"):
        TicTacToeEnv(move_credit=-1.0)
    # Off by default: no token rewards, the reward unchanged.
    plain = run(GameGrader().grade(won, task))
    assert plain.token_rewards is None and plain.value == 1.0
    assert "move_credit" not in plain.components


@pytest.mark.slow
def test_connect4_move_credit_marks_the_missed_win():
    # X holds the bottom of columns 1-3 (O on top of them): column 4 wins now.
    task = Task(id="c/credit", prompt="play", info={"mark": "X", "opening": [1, 1, 2, 2, 3, 3]},
                env="connect4-v1")  # fmt: skip
    env = Connect4Env(move_credit=1.0)
    grader = env.default_grader()
    values = grader._expert.move_values(env.rules.opening_board([1, 1, 2, 2, 3, 3]), "X")
    mean = sum(values.values()) / len(values)
    assert values[4] == 1.0 and values[7] < 1.0  # the searcher sees the win in one
    won = played_rollout(env, task, ["<move>4</move>"])
    score = run(grader.grade(won, task))
    assert score.value == 1.0 and score.token_rewards == pytest.approx((1.0 - mean,) * 3)
    missed = played_rollout(env, task, ["<move>7</move>", "<move>7</move>", "<move>6</move>"])
    credits = grader.move_credits(missed, task)
    assert credits[0] == pytest.approx(values[7] - mean) and credits[0] < 0 < 1.0 - mean
    assert run(grader.grade(missed, task)).token_rewards[:3] == pytest.approx((credits[0],) * 3)
