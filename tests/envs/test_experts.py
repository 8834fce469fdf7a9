"""Experts play their env through reset/step with text actions and pass its grader.

Pass counts are the measured ones on the first train tasks with the kwargs of the
examples (`examples/agentic_*.toml`); the demos hold the env's real observations.
"""

from __future__ import annotations

import asyncio
import json
import re
import tomllib
from pathlib import Path

import pytest

from rldojo.envs.arith_tools.expert import expression_of
from rldojo.envs.experts import expert_for, list_experts, tool_call_text, tool_exchanges
from rldojo.envs.games.expert import read_board
from rldojo.envs.games.rules import TicTacToe, negamax
from rldojo.envs.registry import make_env
from rldojo.types import Rollout, Task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_ID = re.compile(r"\b(?:ACC|CON|DEAL|TCK|ACT|EML)-\d{4,6}\b")


def example_kwargs(name: str) -> dict:
    return tomllib.loads((EXAMPLES / name).read_text())["env"]["kwargs"]


async def _episode(env, expert, task: Task, seed: int) -> tuple[list[dict], dict, object]:
    """One episode as a model plays it: reset, then act/step until done; and its score."""
    obs = await env.reset(task, seed=seed)
    messages, info = list(obs.messages), {}
    for _ in range(40):
        action = expert.act(list(messages), task)
        messages.append({"role": "assistant", "content": action})
        step = await env.step(action)
        info.update(step.info)
        if step.done:
            break
        messages += step.messages
    rollout = Rollout(task.id, task.env, messages, action, info=info)
    return messages, info, await env.default_grader().grade(rollout, task)


def play(env_id: str, kwargs: dict, n: int) -> list[tuple[Task, list[dict], dict, object]]:
    env, expert = make_env(env_id, **kwargs), expert_for(env_id, **kwargs)

    async def all_tasks():
        out = []
        for i, task in enumerate(env.tasks("train", seed=0, n=n)):
            out.append((task, *await _episode(env, expert, task, seed=i)))
        return out

    return asyncio.run(all_tasks())


def passes(games) -> int:
    return sum(score.components.get("correct", 0.0) >= 1.0 for *_, score in games)


# ------------------------------------------------------------------ registry


def test_expert_for_an_env_without_one_is_a_one_line_value_error():
    with pytest.raises(ValueError) as err:
        expert_for("arith-v1")
    message = str(err.value)
    assert "arith-v1" in message and "\n" not in message
    assert all(env_id in message for env_id in list_experts())
    assert {"arith-tools-v1", "crm-v1", "tictactoe-v1", "connect4-v1"} <= set(list_experts())


def test_arith_expert_needs_the_calculator():
    with pytest.raises(ValueError, match="calculator"):
        expert_for("arith-tools-v1", calculator=False)


# ------------------------------------------------------------------ arith-tools-v1


def test_arith_expert_passes_levels_1_and_2_with_one_calculator_call():
    games = play("arith-tools-v1", example_kwargs("agentic_arith_tools.toml"), 20)
    assert passes(games) == 20  # measured: 200 of 200
    for task, messages, info, score in games:
        calls = [m["content"] for m in messages if m["role"] == "assistant"]
        expression = expression_of(str(task.prompt))
        assert calls == [
            tool_call_text("calculator", {"expression": expression}),
            f"<answer>{task.answer}</answer>",
        ]
        assert " " not in expression
        assert info["tool/by_name"] == {"calculator": 1}  # never the python tool
        assert task.answer in messages[-2]["content"]  # read from the tool's reply
        assert score.components["tags"] == 1.0


def test_arith_expert_passes_levels_3_and_4():
    games = play("arith-tools-v1", {"levels": [3, 4], "python": "off"}, 10)
    assert passes(games) == 10  # measured: 200 of 200 per level


# ------------------------------------------------------------------ crm-v1


@pytest.mark.parametrize(("levels", "n"), [([1, 2], 20), ([3], 10), ([4], 10)])
def test_crm_expert_passes_every_level(levels, n):
    kwargs = {**example_kwargs("agentic_crm.toml"), "levels": levels}
    games = play("crm-v1", kwargs, n)
    assert passes(games) == n  # measured: 200 of 200 on each level, within the 6 turns
    for _, _, info, score in games:
        assert score.components["collateral"] == 0.0 and score.components["message"] == 1.0
        assert info["tool/errors"] == 0 and info["episode/turns"] <= 6


def test_crm_demos_take_ids_from_the_tool_results():
    kwargs = {**example_kwargs("agentic_crm.toml"), "levels": [1, 2, 3, 4]}
    games = play("crm-v1", kwargs, 24)
    looked_up = 0
    for task, messages, _, _ in games:
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            seen = " ".join(m["content"] for m in messages[:i] if m["role"] in ("user", "tool"))
            for exchange in (x for turn in tool_exchanges(messages[: i + 2]) for x in turn):
                for value in map(str, exchange.arguments.values()):
                    if _ID.fullmatch(value):
                        assert value in seen, (task.prompt, value)  # never a guessed id
                        looked_up += value not in str(task.prompt)
        answer = messages[-1]["content"]
        assert answer.startswith("<answer>") and len(answer) < 200
        for turn in (m["content"] for m in messages if m["role"] == "assistant"):
            for body in re.findall(r"<tool_call>(.*?)</tool_call>", turn):
                assert json.loads(body)["name"]  # one JSON object per call
    assert looked_up > 20


def test_crm_move_stage_updates_the_deal_the_search_returned():
    kwargs = {**example_kwargs("agentic_crm.toml"), "levels": [2]}
    env = make_env("crm-v1", **kwargs)
    task = next(t for t in env.tasks("train", n=40) if t.info["template"] == "move_stage")
    messages, info, score = asyncio.run(_episode(env, expert_for("crm-v1"), task, seed=0))
    deal_id = task.info["expected"]["updates"][0]["id"]
    search, update = (turn[0] for turn in tool_exchanges(messages)[1:3])
    assert search.name == "search_deals" and search.result[0]["id"] == deal_id
    assert update.name == "update_deal" and update.arguments["deal_id"] == deal_id
    assert [c["id"] for c in info["crm/diff"]] == [deal_id] and score.value == 1.0


# ------------------------------------------------------------------ games


def _lost_before_first_move(messages: list[dict]) -> bool:
    """The opening position was lost for the expert whatever it played (or already lost)."""
    first = messages[0]["content"]
    rules, board = TicTacToe(), read_board(TicTacToe(), first)
    mark = re.findall(r"You are ([XO])\.", first)[-1]
    other = "O" if mark == "X" else "X"
    won = any(board[c] == other and rules.wins(board, c) for c in range(9))
    return won or negamax(rules, list(board), mark, 9, -3.0, 3.0) < -0.5


@pytest.mark.slow
def test_tictactoe_expert_wins_and_loses_only_lost_openings():
    games = play("tictactoe-v1", example_kwargs("agentic_tictactoe.toml"), 40)
    outcomes = [info["game/outcome"] for _, _, info, _ in games]
    assert outcomes.count("win") == 36  # measured: 444 of 500 (88.8%)
    assert all(info["game/illegal_moves"] == 0 for _, _, info, _ in games)
    lost = [messages for (_, messages, info, _) in games if info["game/outcome"] == "loss"]
    assert lost and all(_lost_before_first_move(m) for m in lost)
    for _, messages, _, _ in games:
        moves = [m["content"] for m in messages if m["role"] == "assistant"]
        assert all(re.fullmatch(r"<move>[1-9]</move>", move) for move in moves)


@pytest.mark.slow
def test_tictactoe_expert_never_loses_to_perfect_play_from_the_start():
    env, expert = make_env("tictactoe-v1", opponent_depth=9), expert_for("tictactoe-v1")
    for mark in "XO":
        task = Task(id=f"blank-{mark}", prompt="play", info={"mark": mark, "opening": []})
        _, info, _ = asyncio.run(_episode(env, expert, task, seed=0))
        assert info["game/outcome"] == "draw"


@pytest.mark.slow
def test_connect4_expert_beats_a_random_opponent():
    games = play("connect4-v1", {"opponent_depth": 0}, 3)
    assert [info["game/outcome"] for _, _, info, _ in games] == ["win"] * 3  # measured 20/20


def test_game_expert_reads_the_board_back_after_an_illegal_move():
    expert, task = expert_for("tictactoe-v1"), Task(id="t", prompt="play", info={"mark": "X"})
    board = " X | X | 3\n---+---+---\n O | O | 6\n---+---+---\n 7 | 8 | 9\nYou are X. Legal"
    messages = [
        {"role": "user", "content": f"Let's play tic-tac-toe.\n\n{board} moves: 3, 6, 7, 8, 9."},
        {"role": "assistant", "content": "<move>1</move>"},
        {"role": "user", "content": "Illegal move: 1 is not a legal move. Legal moves: 3, 6."},
    ]
    assert expert.act(messages, task) == "<move>3</move>"  # the win, not the block at 6


def test_tool_exchanges_pair_calls_with_replies_after_parse_errors():
    ok = '<tool_response>{"name": "calculator", "result": "6"}</tool_response>'
    bad = '<tool_response>{"error": "malformed", "message": "x"}</tool_response>'
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<tool_call>{oops</tool_call>\n"
         + tool_call_text("calculator", {"expression": "2*3"})},
        {"role": "tool", "content": bad},
        {"role": "tool", "content": ok},
        {"role": "assistant", "content": "thinking"},
        {"role": "user", "content": "No tool call or final answer found."},
    ]  # fmt: skip
    [[exchange]] = tool_exchanges(messages)
    assert (exchange.name, exchange.ok, exchange.result) == ("calculator", True, "6")
