"""arith-v1: determinism, split disjointness, correct answers, levels, episode and reward."""

from __future__ import annotations

import ast
import asyncio
import operator
import re

import pytest

from rldojo.envs.arith.env import ARITH_INSTRUCTION, ArithEnv, is_test_question
from rldojo.envs.base import EpisodeDone
from rldojo.envs.registry import make_env
from rldojo.types import Rollout

ALL = (1, 2, 3, 4)
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(expr: str) -> int:
    """Evaluate + - * // on integers, independently of the generator."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            left, right = walk(node.left), walk(node.right)
            assert left % right == 0, "word problems share evenly"
            return left // right
        raise AssertionError(f"unexpected node in {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


def test_same_seed_same_tasks_and_prefix_stable() -> None:
    env = ArithEnv(levels=ALL)
    a = env.tasks("train", seed=3, n=50)
    b = ArithEnv(levels=ALL).tasks("train", seed=3, n=50)
    assert a == b
    assert env.tasks("train", seed=3, n=20) == a[:20]
    assert (
        env.tasks("test", seed=3, n=30)
        == env.tasks("test", seed=3, n=10) + env.tasks("test", seed=3, n=30)[10:]
    )


def test_different_seeds_differ() -> None:
    env = ArithEnv(levels=ALL)
    q0 = [t.info["question"] for t in env.tasks("train", seed=0, n=50)]
    q1 = [t.info["question"] for t in env.tasks("train", seed=1, n=50)]
    assert q0 != q1
    assert len(set(q0) & set(q1)) < 25


@pytest.mark.parametrize("levels", [(1,), (2,), (3,), (4,), ALL])
def test_test_split_is_disjoint_from_train(levels: tuple[int, ...]) -> None:
    env = ArithEnv(levels=levels)
    test = env.tasks("test", seed=0)
    assert len(test) == 200 and len(env.tasks("train", seed=0)) == 1000
    test_questions = {t.info["question"] for t in test}
    assert len(test_questions) == len(test)  # test questions are distinct
    for seed in (0, 1):  # disjoint for any seed, and for large train sets
        train = {t.info["question"] for t in env.tasks("train", seed=seed, n=3000)}
        assert not train & test_questions
    assert all(is_test_question(q) for q in test_questions)


@pytest.mark.parametrize("level", ALL)
def test_every_level_produces_correct_tasks(level: int) -> None:
    tasks = ArithEnv(levels=(level,)).tasks("train", seed=0, n=300)
    assert len(tasks) == 300
    for i, task in enumerate(tasks):
        assert task.id == f"arith-v1/train/0/{i}"
        assert task.env == "arith-v1"
        assert task.info["level"] == level
        assert task.prompt == f"{task.info['question']}\n{ARITH_INSTRUCTION}"
        answer = int(task.answer)
        assert answer >= 0
        expr = task.info["expression"]
        assert _evaluate(expr) == answer
        question = task.info["question"]
        if level <= 3:  # the question states the expression itself
            match = re.fullmatch(r"What is (.+)\?", question)
            assert match is not None
            assert _evaluate(match.group(1)) == answer
        else:  # every number of the expression appears in the sentence
            numbers = re.findall(r"\d+", question)
            assert sorted(re.findall(r"\d+", expr)) == sorted(numbers)


def test_level_ranges() -> None:
    for task in ArithEnv(levels=(1,)).tasks("train", n=300):
        a, b = map(int, re.findall(r"\d+", task.info["question"]))
        assert 2 <= a <= 50 and 2 <= b <= 50
    ops = {task.info["expression"].split()[1] for task in ArithEnv(levels=(2,)).tasks(n=100)}
    assert ops == {"-", "*"}
    forms = {re.sub(r"\d+", "n", t.info["expression"]) for t in ArithEnv(levels=(3,)).tasks(n=300)}
    assert len(forms) >= 5 and all(f.count("n") == 3 for f in forms)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="levels"):
        ArithEnv(levels=(5,))
    with pytest.raises(ValueError, match="levels"):
        ArithEnv(levels=())
    with pytest.raises(ValueError, match="split"):
        ArithEnv().tasks("validation")


def test_episode_and_default_grader() -> None:
    env = make_env("arith-v1", levels=[1])
    task = env.tasks("test", seed=0, n=1)[0]

    async def main() -> None:
        obs = await env.reset(task, seed=0)
        assert [m["role"] for m in obs.messages] == ["system", "user"]
        assert obs.messages[1]["content"].endswith("'Answer: <number>'.")
        result = await env.step(f"Answer: {task.answer}")
        assert result.done and result.messages == []
        with pytest.raises(EpisodeDone):
            await env.step("again")
        grader = env.default_grader()
        for text, value in [
            (f"Let me add.\nAnswer: {task.answer}", 1.0),
            (f"Answer: {int(task.answer) + 1}", 0.0),
            ("no idea", -0.5),
        ]:
            rollout = Rollout(task_id=task.id, env=env.env_id, messages=[], completion=text)
            score = await grader.grade(rollout, task)
            assert (score.status, score.value) == ("ok", value)

    asyncio.run(main())
    no_system = ArithEnv(system_prompt=None)
    assert [m["role"] for m in no_system.prompt_messages(task)] == ["user"]
