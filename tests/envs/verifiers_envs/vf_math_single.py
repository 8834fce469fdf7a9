"""vf_math_single: a single-turn addition task written against verifiers' public classes
(`SingleTurnEnv`, `XMLParser`, `Rubric`), as a verifiers user would write it.

The policy answers in ``<answer>...</answer>``; the rubric weighs correctness 1.0 and the
parser's format reward 0.2. `fail` adds a third, misbehaving reward function ("raise",
"hang" (async), "hang_sync", "nan", "group") for the failure tests.
"""

import asyncio
import time

import verifiers as vf
from datasets import Dataset

PAIRS = [(2, 3), (4, 5), (10, 7), (1, 1), (6, 8), (9, 9)]
EVAL_PAIRS = [(20, 22), (13, 4)]


def _rows(pairs: list[tuple[int, int]]) -> list[dict[str, str]]:
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs]


def _misbehaving(fail: str):
    def exploding(completion, answer) -> float:
        raise ZeroDivisionError("no reward today")

    async def hanging(completion) -> float:
        await asyncio.sleep(60)
        return 1.0

    def hanging_sync(completion) -> float:
        time.sleep(5)
        return 1.0

    def not_a_number(completion) -> float:
        return float("nan")

    def group_reward(completions, answers) -> list[float]:
        return [1.0 for _ in completions]

    return {
        "raise": exploding,
        "hang": hanging,
        "hang_sync": hanging_sync,
        "nan": not_a_number,
        "group": group_reward,
    }[fail]


def load_environment(num_examples: int = -1, fail: str = "") -> vf.Environment:
    """The environment; `num_examples` rows of training data (-1: all)."""
    rows = _rows(PAIRS if num_examples < 0 else PAIRS[:num_examples])
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(
        funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser
    )
    if fail:
        rubric.add_reward_func(_misbehaving(fail), weight=0.5)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(_rows(EVAL_PAIRS)),
        system_prompt="Add the numbers. Reply with <answer>...</answer>.",
        parser=parser,
        rubric=rubric,
    )
