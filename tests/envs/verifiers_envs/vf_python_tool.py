"""vf_python_tool: a verifiers `ToolEnv` with a Python tool that evaluates arithmetic.

The policy calls ``evaluate(expression)`` and then replies with the number; the episode
ends on a reply without a tool call (verifiers' `ToolEnv` rule). The rubric rewards the
last reply's number being the answer, and (weight 0.1) having used the tool; `ToolEnv`
adds its own tool-call counters as weight-0 metrics.
"""

import ast
import operator

import verifiers as vf
from datasets import Dataset

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> str:
    """Evaluate an arithmetic expression of integers, + - and *.

    Args:
        expression: the expression, e.g. "17 * 23".
    """

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:40]}")

    return str(value(ast.parse(expression, mode="eval").body))


def load_environment(max_turns: int = 4) -> vf.Environment:
    rows = [
        {"question": "What is 17 * 23?", "answer": "391"},
        {"question": "What is 120 - 45 * 2?", "answer": "30"},
    ]

    def final_number(completion, answer) -> float:
        last = completion[-1]
        return 1.0 if last.role == "assistant" and (last.content or "").strip() == answer else 0.0

    def used_tool(state) -> float:
        return 1.0 if len(state["trajectory"]) > 1 else 0.0

    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[evaluate],
        max_turns=max_turns,
        system_prompt="Use the evaluate tool, then reply with the number alone.",
        rubric=vf.Rubric(funcs=[final_number, used_tool], weights=[1.0, 0.1]),
    )
