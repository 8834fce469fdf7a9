"""The rules of the board games of `rldojo.envs.games.env`, and negamax search over them.

`Rules` is a two-player game on a grid of cells ('.' empty) won by a line of `connect`
stones; `TicTacToe` (cells 1-9) and `Connect4` (columns 1-7) are its two games.
`negamax` searches a position with alpha-beta to a depth, scoring leaves with the
rules' open-lines heuristic. Pure game logic: no environment, no model.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["Connect4", "Rules", "TicTacToe", "negamax"]


class Rules:
    """A two-player board game on a grid of ``rows x cols`` cells ('.' empty)."""

    name = ""
    rows = cols = connect = 0
    move_word = ""

    def legal(self, board: list[str]) -> list[int]:
        raise NotImplementedError

    def play(self, board: list[str], move: int, mark: str) -> int:
        """Put `mark` for `move` (1-based); returns the cell index it landed on."""
        raise NotImplementedError

    def undo(self, board: list[str], cell: int) -> None:
        board[cell] = "."

    def opening_board(self, opening: Sequence[int]) -> list[str]:
        """The board after `opening`, moves played alternately from X on an empty board."""
        board = ["."] * (self.rows * self.cols)
        for k, move in enumerate(opening):
            self.play(board, int(move), "XO"[k % 2])
        return board

    def wins(self, board: list[str], cell: int) -> bool:
        """Does the stone on `cell` complete a line of `connect`?"""
        mark, r0, c0 = board[cell], *divmod(cell, self.cols)
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            run = 1
            for sign in (1, -1):
                r, c = r0 + sign * dr, c0 + sign * dc
                while (
                    0 <= r < self.rows and 0 <= c < self.cols and board[r * self.cols + c] == mark
                ):
                    run += 1
                    r, c = r + sign * dr, c + sign * dc
            if run >= self.connect:
                return True
        return False

    def heuristic(self, board: list[str], mark: str) -> float:
        """Open lines: how close each side is to connecting, from `mark`'s view."""
        other = "O" if mark == "X" else "X"
        score = 0.0
        for line in self._lines:
            cells = [board[i] for i in line]
            mine, theirs = cells.count(mark), cells.count(other)
            if theirs == 0 and mine:
                score += 4.0**mine
            elif mine == 0 and theirs:
                score -= 4.0**theirs
        return score / 4.0 ** (self.connect + 1)  # stays below a win's value of 1

    @functools.cached_property
    def _lines(self) -> list[tuple[int, ...]]:
        out = []
        n = self.connect
        for r in range(self.rows):
            for c in range(self.cols):
                for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                    end_r, end_c = r + dr * (n - 1), c + dc * (n - 1)
                    if 0 <= end_r < self.rows and 0 <= end_c < self.cols:
                        out.append(tuple((r + dr * k) * self.cols + c + dc * k for k in range(n)))
        return out

    def render(self, board: list[str]) -> str:
        raise NotImplementedError


class TicTacToe(Rules):
    name, rows, cols, connect, move_word = "tic-tac-toe", 3, 3, 3, "cell"

    def legal(self, board: list[str]) -> list[int]:
        return [i + 1 for i, v in enumerate(board) if v == "."]

    def play(self, board: list[str], move: int, mark: str) -> int:
        board[move - 1] = mark
        return move - 1

    def render(self, board: list[str]) -> str:
        cells = [v if v != "." else str(i + 1) for i, v in enumerate(board)]
        rows = [" " + " | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
        return "\n---+---+---\n".join(rows)


class Connect4(Rules):
    name, rows, cols, connect, move_word = "connect four", 6, 7, 4, "column"

    def legal(self, board: list[str]) -> list[int]:
        return [c + 1 for c in range(self.cols) if board[c] == "."]

    def play(self, board: list[str], move: int, mark: str) -> int:
        for r in range(self.rows - 1, -1, -1):
            cell = r * self.cols + move - 1
            if board[cell] == ".":
                board[cell] = mark
                return cell
        raise ValueError(f"column {move} is full")

    def render(self, board: list[str]) -> str:
        rows = [" ".join(board[r * 7 : r * 7 + 7]) for r in range(self.rows)]
        return "\n".join([*rows, " ".join(str(c) for c in range(1, 8))])


def negamax(
    rules: Rules, board: list[str], mark: str, depth: int, alpha: float, beta: float
) -> float:
    """Value of `board` for `mark` to move, searching `depth` plies (win = 1, faster is better)."""
    other = "O" if mark == "X" else "X"
    moves = rules.legal(board)
    if not moves:
        return 0.0
    if depth == 0:
        return rules.heuristic(board, mark)
    best = -2.0
    for move in moves:
        cell = rules.play(board, move, mark)
        if rules.wins(board, cell):
            value = 1.0 + depth * 1e-3
        else:
            value = -negamax(rules, board, other, depth - 1, -beta, -alpha)
        rules.undo(board, cell)
        best = max(best, value)
        alpha = max(alpha, value)
        if alpha >= beta:
            break
    return best
