"""Per-turn credit for crm-v1: the tool the agent chose at each turn, against the expert.

An episode's outcome says *that* it failed, not at which turn. The crm cold start fails
at the second tool (after `search_accounts` it calls `create_ticket` to look up or move
a deal), and outcome-only RL answered that by dropping second calls altogether
(docs/studies/2026-12-02-agentic-recipe-search.md). The scripted expert
(`rldojo.envs.crm.expert`) knows, at any point on its own path, what the next turn does:
which tool it calls first, or that it answers. `turn_credits` walks the policy's turns:

    +1  the turn makes the expert's choice (the same first tool, or an answer where the
        expert answers); the episode stays on the expert's path
    -1  the first turn that makes another choice; it leaves the path
     0  every turn after that (the script is not defined off its path)

With `CrmReward.turn_credit = c > 0` the grader puts c x credit on each turn's tokens
(`Score.token_rewards`, which the trainer adds to the outcome's advantage), as
tic-tac-toe's `move_credit` does; ``score.components["turn_credit"]`` is the mean credit
of the turns it judged.
"""

from __future__ import annotations

from rldojo.envs.crm.expert import CrmExpert
from rldojo.envs.tool_calls import parse_turn
from rldojo.types import Message, Task

__all__ = ["turn_credits"]


def _choice(text: str) -> str:
    """A turn's choice: its first tool call's name, "answer", or "other"."""
    parsed = parse_turn(text)
    if parsed.calls:
        return parsed.calls[0].name
    return "answer" if parsed.answer is not None else "other"


def turn_credits(messages: list[Message], task: Task) -> list[float]:
    """+1 / -1 / 0 per assistant turn of the conversation (see the module docstring)."""
    expert, credits, on_path = CrmExpert(), [], True
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if not on_path:
            credits.append(0.0)
            continue
        same = _choice(str(message["content"])) == _choice(expert.act(messages[:i], task))
        credits.append(1.0 if same else -1.0)
        on_path = same
    return credits
