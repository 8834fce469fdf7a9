"""Where a tic-tac-toe policy puts its move: the move token's distribution, per checkpoint.

On `--positions` random positions (2-6 random stones, no finished game, the side to move
plays), each shown the way `tictactoe-v1` opens an episode (its first user turn, through
the env's own `reset`), one forward pass gives the distribution of the token after the
assistant's ``<move>``. Reported per checkpoint:

- `p_expert`: mean probability of the expert's move (`rldojo.envs.games.expert`, negamax
  with ties broken for the most chances against a random opponent), and `greedy_is_expert`;
- `entropy_nats`: mean entropy of that token over the whole vocabulary;
- `p_win` where the side to move can win at once (mass on the winning cells), `p_block`
  where it cannot but the opponent threatens to (mass on the blocking cells), and the
  greedy move's rate of doing either (`greedy_wins`, `greedy_blocks`);
- `greedy_cells`: how often each cell is the greedy move.

The same positions for every checkpoint (`--seed`), so differences are paired. This is the
diagnostic behind the README's tic-tac-toe paragraph: whether RL after SFT moved mass onto
the moves that decide games, or only sharpened the policy. An existing `--out` file of the
same positions and seed keeps its other checkpoints (a label probed again is replaced).

Usage: python benchmarks/game_policy_probe.py sft=RUN/checkpoints/step_N rl=... \
           [--positions 200] [--seed 1] [--results DIR | --out FILE] [--dry]
Writes benchmarks/results/game_policy_probe/default.json (`results_io`), or --out FILE.
`--dry`: tiny-random as the only checkpoint, 4 positions, into a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from results_io import add_result_args, result_path, write_result  # benchmarks/ on sys.path

from rldojo.envs.games.env import TicTacToeEnv
from rldojo.envs.games.expert import make_expert
from rldojo.envs.games.rules import TicTacToe
from rldojo.policy.base import chat_template_ids
from rldojo.policy.models import TINY_RANDOM, load_model

RULES = TicTacToe()


def positions(n: int, seed: int) -> list[tuple[list[str], str]]:
    """`n` random unfinished boards with 2-6 stones, and the mark to move."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        board, finished = ["."] * 9, False
        for k in range(rng.choice((2, 3, 4, 5, 6))):
            cell = RULES.play(board, rng.choice(RULES.legal(board)), "XO"[k % 2])
            finished = finished or RULES.wins(board, cell)
        if not finished and len(RULES.legal(board)) >= 2:
            out.append((board, "X" if board.count(".") % 2 == 1 else "O"))
    return out


def winning_cells(board: list[str], mark: str) -> list[int]:
    """The cells where `mark` completes a line at once."""
    found = []
    for move in RULES.legal(board):
        cell = RULES.play(board, move, mark)
        if RULES.wins(board, cell):
            found.append(move)
        RULES.undo(board, cell)
    return found


def prompt_ids(tokenizer: Any, board: list[str], mark: str) -> list[int]:
    """The env's opening of a game at `board` (`mark` to move), then ``<move>``."""
    stones = [(i + 1, v) for i, v in enumerate(board) if v != "."]
    xs, os_ = [c for c, v in stones if v == "X"], [c for c, v in stones if v == "O"]
    opening = [c for pair in zip(xs, [*os_, None], strict=False) for c in pair if c is not None]
    env = TicTacToeEnv()
    # A held-out task of the same mark, its opening replaced: the env's own prompt text.
    template = next(t for t in env.tasks("test", n=16) if t.info["mark"] == mark)
    task = replace(template, id="probe", info={**template.info, "opening": opening})
    obs = asyncio.run(env.reset(task, seed=0))
    assert env.state.board == board, "the opening did not rebuild the position"
    return chat_template_ids(tokenizer, obs.messages) + tokenizer.encode(
        "<move>", add_special_tokens=False
    )


def probe(checkpoint: str, boards: list[tuple[list[str], str]]) -> dict[str, Any]:
    model, tokenizer = load_model(checkpoint)
    model.eval()
    digits = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(1, 10)]
    if any(len(d) != 1 for d in digits):
        raise SystemExit(f"{checkpoint}: cells are not single tokens ({digits})")
    cell_token = [d[0] for d in digits]
    expert = make_expert()
    sums: Counter[str] = Counter()
    greedy_cells: Counter[int] = Counter()
    for board, mark in boards:
        ids = torch.tensor([prompt_ids(tokenizer, board, mark)])
        with torch.no_grad():
            probs = torch.softmax(model(ids).logits[0, -1].float(), dim=-1)
        entropy = -float((probs * torch.log(probs.clamp_min(1e-12))).sum())
        p = {m: float(probs[cell_token[m - 1]]) for m in RULES.legal(board)}
        greedy, best = max(p, key=p.__getitem__), expert.best_move(board, mark)
        greedy_cells[greedy] += 1
        sums.update(n=1, p_expert=p[best], greedy_is_expert=greedy == best, entropy=entropy)
        wins = winning_cells(board, mark)
        blocks = winning_cells(board, "O" if mark == "X" else "X")
        if wins:
            sums.update(n_win=1, p_win=sum(p[m] for m in wins), greedy_wins=greedy in wins)
        elif blocks:
            blocked = greedy in blocks
            sums.update(n_block=1, p_block=sum(p[m] for m in blocks), greedy_blocks=blocked)
    n, n_win, n_block = sums["n"], max(sums["n_win"], 1), max(sums["n_block"], 1)
    return {
        "checkpoint": checkpoint,
        "positions": n,
        "p_expert": sums["p_expert"] / n,
        "greedy_is_expert": sums["greedy_is_expert"] / n,
        "entropy_nats": sums["entropy"] / n,
        "win_positions": sums["n_win"],
        "p_win": sums["p_win"] / n_win,
        "greedy_wins": sums["greedy_wins"] / n_win,
        "block_positions": sums["n_block"],
        "p_block": sums["p_block"] / n_block,
        "greedy_blocks": sums["greedy_blocks"] / n_block,
        "greedy_cells": {str(c): greedy_cells[c] for c in range(1, 10)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="*", help="LABEL=PATH (a checkpoint directory)")
    parser.add_argument("--positions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(parser, "tiny-random as the only checkpoint, 4 positions")
    args = parser.parse_args()
    if args.dry:
        args.checkpoints, args.positions = [f"tiny={TINY_RANDOM}"], 4
    if not args.checkpoints:
        parser.error("give at least one LABEL=PATH")
    name = "dry" if args.dry else "default"
    args.out = args.out or result_path("game_policy_probe", name, args.results, dry=args.dry)
    boards = positions(args.positions, args.seed)
    result: dict[str, Any] = {"positions": args.positions, "seed": args.seed, "checkpoints": {}}
    if args.out.exists():  # keep the other checkpoints probed on the same positions
        old = json.loads(args.out.read_text())
        if (old.get("positions"), old.get("seed")) == (args.positions, args.seed):
            result["checkpoints"] = old.get("checkpoints", {})
            # The manifest is rewritten for this run; the checkpoints kept name their own paths.
            result["kept_from"] = old.get("manifest", {}).get("git")
    for spec in args.checkpoints:
        label, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"{spec!r}: write LABEL=PATH")
        row = result["checkpoints"][label] = probe(path, boards)
        print(f"{label}: P(expert) {row['p_expert']:.3f}, greedy = expert "
              f"{row['greedy_is_expert']:.1%}, entropy {row['entropy_nats']:.2f} nats, "
              f"P(win) {row['p_win']:.3f} ({row['win_positions']}), P(block) "
              f"{row['p_block']:.3f} ({row['block_positions']})")  # fmt: skip
        if not math.isfinite(row["entropy_nats"]):
            raise SystemExit(f"{label}: non-finite entropy")
    path = write_result("game_policy_probe", name, result, path=args.out, seed=args.seed,
                        dry=args.dry)  # fmt: skip
    print(f"-> {path}")


if __name__ == "__main__":
    main()
