"""tictactoe-v1 and connect4-v1: board games against a scripted opponent.

The policy plays one mark (X moves first) and answers each turn with ``<move>N</move>``:
a cell 1-9 in tic-tac-toe, a column 1-7 in connect four (``<answer>N</answer>`` is
accepted too). The environment applies the move, lets the opponent reply, and shows the
new board. An illegal or missing move is refused with the legal moves listed and counted;
after `max_illegal` of them the game is lost by forfeit.

Opponent strength (`opponent_depth`): 0 plays uniformly random legal moves; ``k > 0``
searches ``k`` plies with negamax and alpha-beta (ties broken at random, so play
varies), tic-tac-toe at depth 9 being perfect; `opponent_epsilon` mixes in random moves.
The opponent's random generator is seeded from the reset seed and the task, and is
part of the snapshot, so the same seed and moves replay the same game and a fork
continues it exactly.

Reward (`GameGrader`): ``outcome_reward[outcome] - illegal_penalty * illegal moves``
with outcomes win 1.0, draw 0.5, loss 0.0, forfeit 0.0, unfinished 0.0 (a limit hit
before the game ended); ``correct`` is 1.0 for a win.

Per-move credit (`move_credit` > 0): the outcome says *that* a game went wrong, not which
move lost it, and against a random opponent it is mostly luck. The grader then also
replays the game and values each of the policy's moves with `credit_expert` (exact
against tic-tac-toe's random opponent), and puts ``move_credit * (value of the move -
mean value of the legal moves)`` on the tokens of the turn that played it, as
`Score.token_rewards` the trainer adds to the outcome's advantage: a missed win or an
unblocked line is marked where it happened. Illegal turns get no credit (the illegal
penalty is in the reward). ``score.components["move_credit"]`` is the mean credit.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from rldojo.envs.base import turn_token_rewards
from rldojo.envs.games.expert import credit_expert
from rldojo.envs.games.rules import Connect4, Rules, TicTacToe, negamax
from rldojo.envs.kwargs import EpisodeLimits, MultiTurnKwargs
from rldojo.envs.multiturn import MultiTurnEnv, TurnOutcome
from rldojo.envs.registry import register
from rldojo.types import Rollout, Score, Task

__all__ = ["Connect4Env", "Connect4Kwargs", "GameGrader", "GameKwargs", "GameState", "TicTacToeEnv"]

_MOVE = re.compile(r"<move>\s*(\d+)\s*</move>")
_ANSWER_MOVE = re.compile(r"<answer>\s*(\d+)\s*</answer>")
DEFAULT_N = {"train": 500, "test": 100}
Outcome = Literal["win", "draw", "loss", "forfeit", "unfinished"]
OUTCOME_REWARD: dict[Outcome, float] = {"win": 1.0, "draw": 0.5, "loss": 0.0, "forfeit": 0.0,
                                        "unfinished": 0.0}  # fmt: skip


@dataclass
class GameState:
    board: list[str]
    mark: str
    rng_state: tuple[object, ...] | None
    """The opponent's random generator (`random.Random.getstate`); None before a reset."""
    history: list[str] = field(default_factory=list)
    illegal: int = 0
    outcome: str = "unfinished"
    actions: list[int | None] = field(default_factory=list)
    """The move of each policy turn, None for an illegal one."""


class GameKwargs(MultiTurnKwargs):
    """The kwargs of tictactoe-v1 and connect4-v1 (`[env] kwargs`); `GameGrader` reads
    the reward's."""

    opponent_depth: int = Field(0, ge=0)
    """Plies the opponent searches (negamax); 0 plays random legal moves, tic-tac-toe at
    9 is perfect."""
    opponent_epsilon: float = Field(0.0, ge=0.0, le=1.0)
    """Chance that the opponent plays a random legal move instead of its search's."""
    max_illegal: int = Field(3, ge=1)
    """Illegal or missing moves before the game is lost by forfeit."""
    outcome_reward: Mapping[Outcome, float] = OUTCOME_REWARD
    """Reward per outcome (a table, e.g. ``{draw = 0.3}``, merged over these)."""
    illegal_penalty: float = 0.1
    """Subtracted per illegal move."""
    move_credit: float = Field(0.0, ge=0.0)
    """Weight of the per-move credit put on each move's tokens (module docstring); 0: off."""
    limits: EpisodeLimits = EpisodeLimits(max_turns=12)
    """Per-episode limits (a table); keys left out keep the game's: max_turns = 12
    (tic-tac-toe: 5 moves at most, and illegal attempts) and the other defaults."""

    @field_validator("outcome_reward", mode="before")
    @classmethod
    def _over_default_rewards(cls, value: object) -> object:
        """A partial table keeps the other outcomes' rewards."""
        return {**OUTCOME_REWARD, **value} if isinstance(value, Mapping) else value


class Connect4Kwargs(GameKwargs):
    """The kwargs of connect4-v1: tictactoe-v1's, with its own limits."""

    limits: EpisodeLimits = EpisodeLimits(max_turns=30)
    """Per-episode limits (a table); keys left out keep connect four's: max_turns = 30
    (21 moves at most, and illegal attempts) and the other defaults."""


class GameEnv(MultiTurnEnv):
    """A board game against a scripted opponent (see the module docstring); built from
    `GameKwargs` (or keywords validated against it)."""

    Kwargs = GameKwargs
    kwargs: GameKwargs
    rules: Rules = TicTacToe()

    def __init__(self, kwargs: GameKwargs | None = None, /, **keywords: object) -> None:
        super().__init__(kwargs, **keywords)
        self.state = GameState(["."] * (self.rules.rows * self.rules.cols), "X", None)

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in DEFAULT_N:
            raise ValueError(f"{self.env_id}: unknown split {split!r}; use 'train' or 'test'")
        out = []
        for i in range(DEFAULT_N[split] if n is None else n):
            rng = random.Random(f"{self.env_id}:{split}:{seed}:{i}")
            mark = rng.choice("XO")
            board = ["."] * (self.rules.rows * self.rules.cols)
            opening: list[int] = []
            for k in range(rng.choice((0, 2, 2, 4)) if split == "train" else 2):
                move = rng.choice(self.rules.legal(board))
                self.rules.play(board, move, "XO"[k % 2])
                opening.append(move)
            prompt = (
                f"Let's play {self.rules.name}. You are {mark}; X moves first. "
                f"On your turn reply with your {self.rules.move_word} as <move>N</move>."
            )
            info = {"mark": mark, "opening": opening, "game": self.rules.name}
            out.append(
                Task(
                    id=f"{self.env_id}/{split}/{seed}/{i}",
                    prompt=prompt,
                    info=info,
                    env=self.env_id,
                )
            )
        return out

    # ---------------------------------------------------------------- episode

    async def setup(self, task: Task, seed: int) -> None:
        rng = random.Random(f"{self.env_id}:opponent:{seed}:{task.id}")
        board = self.rules.opening_board(task.info.get("opening", ()))
        self.state = GameState(board, str(task.info.get("mark", "X")), rng.getstate())
        if self._to_move() != self.state.mark:
            self._opponent_move()

    def opening(self, task: Task) -> list[dict[str, str]]:
        messages = super().opening(task)
        messages[-1]["content"] += "\n\n" + self._status()
        return messages

    def _to_move(self) -> str:
        stones = sum(v != "." for v in self.state.board)
        return "X" if stones % 2 == 0 else "O"

    def _status(self) -> str:
        s = self.state
        last = (
            f"Opponent played {s.history[-1].split(':')[1]}.\n"
            if s.history and s.history[-1].startswith("opp")
            else ""
        )
        legal = ", ".join(map(str, self.rules.legal(s.board)))
        return f"{last}{self.rules.render(s.board)}\nYou are {s.mark}. Legal moves: {legal}."

    def _opponent_move(self) -> None:
        s, rules = self.state, self.rules
        assert s.rng_state is not None, "the opponent moves after a reset"
        rng = random.Random()
        rng.setstate(s.rng_state)
        opp = "O" if s.mark == "X" else "X"
        moves = rules.legal(s.board)
        depth = self.kwargs.opponent_depth
        if depth == 0 or rng.random() < self.kwargs.opponent_epsilon:
            move = rng.choice(moves)
        else:
            scored = []
            for m in moves:
                cell = rules.play(s.board, m, opp)
                won = rules.wins(s.board, cell)
                value = 2.0 if won else -negamax(rules, s.board, s.mark, depth - 1, -3.0, 3.0)
                rules.undo(s.board, cell)
                scored.append((value, m))
            best = max(v for v, _ in scored)
            move = rng.choice([m for v, m in scored if v >= best - 1e-9])
        s.rng_state = rng.getstate()
        cell = rules.play(s.board, move, opp)
        s.history.append(f"opp:{move}")
        if rules.wins(s.board, cell):
            s.outcome = "loss"
        elif not rules.legal(s.board):
            s.outcome = "draw"

    async def turn(self, action: str) -> TurnOutcome:
        s = self.state
        found = _MOVE.findall(action) or _ANSWER_MOVE.findall(action)
        legal = self.rules.legal(s.board)
        move = int(found[-1]) if found and len(found[-1]) <= 3 else None
        s.actions.append(move if move in legal else None)
        if move not in legal:
            s.illegal += 1
            why = "no <move>N</move> found" if move is None else f"{move} is not a legal move"
            if s.illegal >= self.kwargs.max_illegal:
                s.outcome = "forfeit"
                return TurnOutcome([], done=True, done_reason="forfeit")
            text = f"Illegal move: {why}. Legal moves: {', '.join(map(str, legal))}."
            return TurnOutcome([{"role": "user", "content": text}])
        cell = self.rules.play(s.board, move, s.mark)
        s.history.append(f"me:{move}")
        if self.rules.wins(s.board, cell):
            s.outcome = "win"
        elif not self.rules.legal(s.board):
            s.outcome = "draw"
        else:
            self._opponent_move()
        if s.outcome != "unfinished":
            return TurnOutcome([], done=True, done_reason="game_over")
        return TurnOutcome([{"role": "user", "content": self._status()}])

    def state_info(self) -> dict[str, Any]:
        s = self.state
        return {
            "game/outcome": s.outcome,
            "game/illegal_moves": s.illegal,
            "game/moves": list(s.history),
            "game/board": "".join(s.board),
            "game/actions": list(s.actions),
        }

    def save_state(self) -> GameState:
        return copy.deepcopy(self.state)

    def load_state(self, state: object) -> None:
        assert isinstance(state, GameState)
        self.state = copy.deepcopy(state)

    def default_grader(self) -> GameGrader:
        return GameGrader(self.kwargs, self.rules)


class GameGrader:
    """``outcome_reward[outcome] - illegal_penalty * illegal moves``, from ``rollout.info``;
    with `move_credit` > 0 also per-move credit as token rewards (module docstring)."""

    name = "game"
    version = "1"

    def __init__(self, kwargs: GameKwargs | None = None, rules: Rules | None = None) -> None:
        """`kwargs`: the environment's (its reward terms and opponent); `rules`: the game's."""
        self.kwargs = kwargs or GameKwargs()
        self.rules = rules or TicTacToe()
        credit = self.kwargs.move_credit > 0
        self._expert = credit_expert(self.rules, self.kwargs.opponent_depth) if credit else None

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = {"grader": self.name, "version": self.version}
        outcome = rollout.info.get("game/outcome")
        k = self.kwargs
        reward = next((r for o, r in k.outcome_reward.items() if o == outcome), None)
        if reward is None:
            return Score.failed(
                "invalid", f"rollout has no game outcome ({outcome!r})", provenance=prov
            )
        illegal = int(rollout.info.get("game/illegal_moves", 0) or 0)
        value = reward - k.illegal_penalty * illegal
        components = {
            "correct": float(outcome == "win"),
            "draw": float(outcome == "draw"),
            "illegal_moves": float(illegal),
        }
        token_rewards = None
        if k.move_credit > 0:
            credits = self.move_credits(rollout, task)
            actions = rollout.info.get("game/actions", ())
            legal = [c for c, a in zip(credits, actions, strict=True) if a is not None]
            components["move_credit"] = sum(legal) / len(legal) if legal else 0.0
            token_rewards = turn_token_rewards(rollout, [k.move_credit * c for c in credits])
        return Score(
            value,
            components=components,
            explanation=f"{outcome}, {illegal} illegal move(s)",
            provenance=prov,
            token_rewards=token_rewards,
        )

    def move_credits(self, rollout: Rollout, task: Task) -> list[float]:
        """Per policy turn: the value of its move minus the mean value of the legal moves
        (`GameExpert.move_values`), 0.0 for an illegal turn. Replays the task's opening
        and ``game/moves``."""
        assert self._expert is not None
        rules, mark = self.rules, str(task.info.get("mark", "X"))
        board = rules.opening_board(task.info.get("opening", ()))
        mine = []
        for entry in rollout.info.get("game/moves", ()):
            who, move = entry.split(":")
            if who == "me":
                values = self._expert.move_values(board, mark)
                mine.append(values[int(move)] - sum(values.values()) / len(values))
            rules.play(board, int(move), mark if who == "me" else ("O" if mark == "X" else "X"))
        played, actions = iter(mine), rollout.info.get("game/actions", ())
        return [0.0 if a is None else next(played, 0.0) for a in actions]


class TicTacToeEnv(GameEnv):
    """tictactoe-v1 (see the module docstring)."""

    env_id = "tictactoe-v1"
    rules = TicTacToe()


class Connect4Env(GameEnv):
    """connect4-v1 (see the module docstring); built from `Connect4Kwargs`."""

    env_id = "connect4-v1"
    Kwargs = Connect4Kwargs
    rules = Connect4()


register(TicTacToeEnv.env_id, TicTacToeEnv)
register(Connect4Env.env_id, Connect4Env)
