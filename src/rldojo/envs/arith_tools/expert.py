"""The arith-tools-v1 expert: one calculator call with the task's expression, then the answer.

    <tool_call>{"name": "calculator", "arguments": {"expression": "4821*977"}}</tool_call>
    <answer>4710117</answer>

The expression is read from the question (each level's wording is fixed, see
`rldojo.envs.arith_tools.env._problem`), written compactly in the calculator's syntax;
level 4's yearly rounding is ``start*(100+p)//100`` repeated (``*`` and ``//`` associate
left). The answer is the number in the calculator's result, never `task.answer`. Only the
calculator is used, even where the python tool is offered.
"""

from __future__ import annotations

import re

from rldojo.envs.arith_tools.env import ENV_ID
from rldojo.envs.experts import tool_call_text, tool_exchanges
from rldojo.types import Message, Task

__all__ = ["ArithToolsExpert", "expression_of", "make_expert"]

_POWER = re.compile(r"What is (\d+) to the power of (\d+)\?")
_PLAIN = re.compile(r"What is ([\d\s*+-]+)\?")
_CHAIN = re.compile(r"Compute (.+), where //")
_GROWTH = re.compile(r"holds (\d+) coins and grows by (\d+)% .* after (\d+) years\?")


def expression_of(question: str) -> str:
    """The calculator expression of an arith-tools-v1 question (`ValueError` if none)."""
    if m := _POWER.search(question):
        return f"{m.group(1)}**{m.group(2)}"
    if m := _PLAIN.search(question):
        return "".join(m.group(1).split())
    if m := _CHAIN.search(question):
        return "".join(m.group(1).replace(" mod ", "%").split())
    if m := _GROWTH.search(question):
        start, pct, years = m.groups()
        return start + f"*{100 + int(pct)}//100" * int(years)
    raise ValueError(f"{ENV_ID}: no arithmetic found in {question[:80]!r}")


class ArithToolsExpert:
    """Plays arith-tools-v1 with the calculator (see the module docstring)."""

    def act(self, messages: list[Message], task: Task) -> str:
        """The calculator call on the first turn; then the answer from its result."""
        exchanges = [x for turn in tool_exchanges(messages) for x in turn]
        if not exchanges:
            question = task.prompt if isinstance(task.prompt, str) else messages[-1]["content"]
            return tool_call_text("calculator", {"expression": expression_of(question)})
        last = exchanges[-1]
        value = str(last.result).split(" ")[0] if last.ok else "unknown"
        return f"<answer>{value}</answer>"


def make_expert(*, env_id: str = ENV_ID, **env_kwargs: object) -> ArithToolsExpert:
    """The expert for an arith-tools-v1 built with these kwargs (it needs the calculator)."""
    if env_kwargs.get("calculator") is False:
        raise ValueError(f"{env_id}: the expert uses the calculator; calculator=False")
    return ArithToolsExpert()
