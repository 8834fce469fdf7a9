"""The experts of tictactoe-v1 and connect4-v1: the negamax best move, as ``<move>N</move>``.

The board and the expert's mark are read from the latest observation (the board the env
rendered, ``You are X.``), so the expert is stateless and follows illegal-move replies
too. Moves are searched with `rldojo.envs.games.rules.negamax`: all nine plies in tic-tac-toe
(perfect play), `CONNECT4_DEPTH` plies in connect four. Ties go to the first move in a
fixed preference order (centre first), so the same position always gets the same move.
"""

from __future__ import annotations

import re

from rldojo.envs.games.rules import Connect4, Rules, TicTacToe, negamax
from rldojo.types import Message, Task

__all__ = ["CONNECT4_DEPTH", "GameExpert", "credit_expert", "make_expert", "read_board"]

CONNECT4_DEPTH = 5
"""Plies searched in connect four, about half a second a game in pure Python. Odd: the
heuristic at the leaves ignores whose move it is, and even depths played no better
than depth 2 (measured: against an opponent of depth 2, depth 4 won 11 of 30 games,
depth 5 won 18)."""

_MARK = re.compile(r"You are ([XO])\.")
_TTT_ROW = re.compile(r"^\s*([XO1-9])\s*\|\s*([XO1-9])\s*\|\s*([XO1-9])\s*$")
_C4_ROW = re.compile(r"^([.XO])(?: ([.XO])){6}$")
_PREFERENCE = {"tic-tac-toe": (5, 1, 3, 7, 9, 2, 4, 6, 8), "connect four": (4, 3, 5, 2, 6, 1, 7)}


def read_board(rules: Rules, text: str) -> list[str] | None:
    """The last board rendered in `text` ('.' for empty cells), or None if there is none."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if isinstance(rules, TicTacToe) and (m := _TTT_ROW.match(line)):
            rows.append([c if c in "XO" else "." for c in m.groups()])
        elif isinstance(rules, Connect4) and _C4_ROW.match(line.strip()):
            rows.append(line.split())
    rows = rows[-rules.rows :]
    if len(rows) < rules.rows:
        return None
    return [cell for row in rows for cell in row]


class GameExpert:
    """Plays a board game of `rldojo.envs.games.env` by negamax search of `depth` plies.

    With `exploit_random`, ties between moves of the same negamax outcome (win, draw,
    loss) go to the move with the best expected reward against a uniformly random
    opponent (exhaustive, so tic-tac-toe only): the expert stays perfect against perfect
    play and gives a random opponent the most chances to blunder.
    """

    def __init__(self, rules: Rules, depth: int, *, exploit_random: bool = False) -> None:
        self.rules, self.depth, self.exploit_random = rules, depth, exploit_random
        self._expected: dict[tuple[str, str], float] = {}

    def _value(self, board: list[str], move: int, mark: str) -> tuple[float, float]:
        """(negamax outcome, expected reward vs random) of playing `move` for `mark`."""
        cell = self.rules.play(board, move, mark)
        try:
            if self.rules.wins(board, cell):
                return 2.0, 1.0
            other = "O" if mark == "X" else "X"
            value = -negamax(self.rules, board, other, self.depth - 1, -3.0, 3.0)
            if self.exploit_random:  # outcome classes: the depth bonus only orders wins
                value = 1.0 if value > 0.5 else (-1.0 if value < -0.5 else 0.0)
                return value, self._random_reply(board, mark)
            return value, 0.0
        finally:
            self.rules.undo(board, cell)

    def _random_reply(self, board: list[str], mark: str) -> float:
        """Expected reward (win 1, draw 0.5) for `mark` when a random opponent moves next."""
        key = ("".join(board), mark)
        if key in self._expected:
            return self._expected[key]
        other = "O" if mark == "X" else "X"
        replies = self.rules.legal(board)
        if not replies:
            return 0.5
        total = 0.0
        for reply in replies:
            cell = self.rules.play(board, reply, other)
            if self.rules.wins(board, cell):
                pass  # a loss adds 0
            elif not self.rules.legal(board):
                total += 0.5
            else:
                total += max(self._expect_move(board, m, mark) for m in self.rules.legal(board))
            self.rules.undo(board, cell)
        self._expected[key] = total / len(replies)
        return self._expected[key]

    def _expect_move(self, board: list[str], move: int, mark: str) -> float:
        cell = self.rules.play(board, move, mark)
        value = 1.0 if self.rules.wins(board, cell) else self._random_reply(board, mark)
        self.rules.undo(board, cell)
        return value

    def best_move(self, board: list[str], mark: str) -> int:
        """The best legal move for `mark`; the first in preference order among equals."""
        legal = self.rules.legal(board)
        order = [m for m in _PREFERENCE[self.rules.name] if m in legal]
        best, choice = (-3.0, -1.0), order[0]
        for move in order:
            outcome, expected = self._value(board, move, mark)
            value = (round(outcome, 9), round(expected, 9))
            if value > best:  # strictly: among equals the first in order stays
                best, choice = value, move
        return choice

    def move_values(self, board: list[str], mark: str) -> dict[int, float]:
        """Each legal move's value for `mark` on the outcome-reward scale (win 1, draw
        0.5, loss 0): with `exploit_random` the exact expected reward against a uniformly
        random opponent (best play after it), else the negamax outcome of `depth` plies
        (1 a forced win, 0 a forced loss, 0.5 anything else)."""
        if self.exploit_random:  # no negamax needed: the expectation is exhaustive
            return {m: self._expect_move(board, m, mark) for m in self.rules.legal(board)}
        values = {}
        for move in self.rules.legal(board):
            outcome, _ = self._value(board, move, mark)
            values[move] = 1.0 if outcome > 0.5 else (0.0 if outcome < -0.5 else 0.5)
        return values

    def act(self, messages: list[Message], task: Task) -> str:
        """``<move>N</move>`` for the latest board the env showed."""
        for message in reversed(messages):
            board = read_board(self.rules, message["content"])
            if message["role"] != "user" or board is None:
                continue
            found = _MARK.findall(message["content"])
            mark = found[-1] if found else str(task.info.get("mark", "X"))
            return f"<move>{self.best_move(board, mark)}</move>"
        return "<move>1</move>"  # no board to read: the env replies with the legal moves


def make_expert(*, env_id: str = "tictactoe-v1", **_env_kwargs: object) -> GameExpert:
    """The expert of `env_id` (tictactoe-v1 or connect4-v1)."""
    if env_id == "connect4-v1":
        return GameExpert(Connect4(), CONNECT4_DEPTH)
    if env_id == "tictactoe-v1":
        return GameExpert(TicTacToe(), 9, exploit_random=True)
    raise ValueError(f"{env_id}: no game expert (tictactoe-v1, connect4-v1)")


def credit_expert(rules: Rules, opponent_depth: int) -> GameExpert:
    """The searcher that values single moves for per-move credit (`GameGrader`):
    exact expected reward against tic-tac-toe's random opponent (depth 0); perfect-play
    outcome classes against a searching tic-tac-toe opponent; `CONNECT4_DEPTH` plies of
    negamax in connect four (forced wins and losses within reach only)."""
    if isinstance(rules, TicTacToe):
        return GameExpert(rules, 9, exploit_random=opponent_depth == 0)
    return GameExpert(rules, CONNECT4_DEPTH)
