"""arith-tools-v1: arithmetic a model cannot do in its head, so it must use a tool.

Levels (every answer is an exact integer, often 20-60 digits):

1. the product of two 12-16 digit numbers;
2. ``a * b - c * d`` with 10-14 digit numbers, or a 3-digit number to a power 9-16;
3. a chain of 4-6 operations (``+ - * // %`` and powers) on large numbers;
4. a word problem with repeated growth: ``N`` years of ``p%`` growth, rounded down yearly.

Tools: ``calculator`` (exact arithmetic on integers and fractions, no floating point) and
``python`` (runs in `rldojo.sandbox`). The python tool is gated: with ``python="auto"``
it is offered only where the sandbox works here (strict mode, or weak mode allowed by
``RLDOJO_SANDBOX_ALLOW_WEAK=1``); ``python="on"`` raises `SandboxUnavailableError`
with the reason instead; ``python="off"`` never offers it.

Reward (`ArithToolsGrader`, every term configurable):

    reward = correct
           + tag_reward * (an integer in <answer> tags and no protocol error)
           - tool_cost * (tool calls, failed ones included)        # over-use hurts too
           - format_penalty * (no final answer)
           - error_penalty * min(protocol errors, error_cap)

Modules: `env` (tasks, tools, `ArithToolsEnv`) and `grader` (`ArithToolsGrader`).
"""

from rldojo.envs.arith_tools.env import ENV_ID, ArithToolsEnv
from rldojo.envs.arith_tools.grader import ArithToolsGrader, ArithToolsReward
from rldojo.envs.registry import register

__all__ = ["ArithToolsEnv", "ArithToolsGrader", "ArithToolsReward"]

register(ENV_ID, ArithToolsEnv)
