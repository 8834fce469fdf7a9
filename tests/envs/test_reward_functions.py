"""Reward functions as a grader (`rldojo.envs.reward_functions`) on hand-built rollouts:
weighted terms as components, None skips, failures are statuses, TRL's batched
signature called once per group, conversational shapes, and the readable environment id
with its fingerprint (`rldojo.envs.function_reward`)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rldojo.api.runs import as_config, with_reward
from rldojo.data.loading import DataError
from rldojo.envs.function_reward import register_function_env, rows_to_tasks
from rldojo.envs.registry import EnvKwargsError, make_env
from rldojo.envs.reward_functions import FunctionGrader, is_batched
from rldojo.types import Rollout, Task

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2 ="}]


def task(prompt="2 + 2 =", **fields) -> Task:
    (t,) = rows_to_tasks([{"prompt": prompt, "answer": "4", **fields}])
    return t


def rollouts(t: Task, *texts: str) -> list[Rollout]:
    return [
        Rollout(task_id=t.id, env="x", messages=[], completion=text, completion_ids=(i, 7),
                sample_index=i, seed=3)
        for i, text in enumerate(texts)
    ]  # fmt: skip


def grade_all(grader: FunctionGrader, t: Task, *texts: str):
    """Each sample graded through the per-sample protocol, concurrently, as the trainer does."""

    async def run():
        return await asyncio.gather(*(grader.grade(r, t) for r in rollouts(t, *texts)))

    return asyncio.run(run())


def has_four(prompt, completion, answer):
    return float(answer in completion)


def short(completions, **kwargs):
    return [float(len(c) <= 3) for c in completions]


def test_each_function_is_a_component_and_the_reward_their_weighted_sum():
    grader = FunctionGrader([has_four, short], weights=[1.0, 0.5], group_size=3)
    assert grader.name == "reward:has_four+short"
    scores = grade_all(grader, task(), "4", "four is 4", "x")
    assert [s.value for s in scores] == [1.5, 1.0, 0.5]
    assert [dict(s.components) for s in scores] == [
        {"has_four": 1.0, "short": 1.0},
        {"has_four": 1.0, "short": 0.0},
        {"has_four": 0.0, "short": 1.0},
    ]
    same_name = FunctionGrader([has_four, has_four, lambda p, c: 1.0])
    assert [t.name for t in same_name.terms] == ["has_four", "has_four_2", "lambda"]


def test_none_skips_a_function_for_that_sample_and_all_none_is_a_failed_grade():
    def only_long(prompt, completion):
        return None if len(completion) < 3 else 2.0

    def never(completions):
        return [None] * len(completions)

    grader = FunctionGrader([only_long, short], [1.0, 3.0], group_size=2)
    score, long_one = grade_all(grader, task(), "4", "4444")
    assert (score.value, dict(score.components)) == (3.0, {"short": 1.0})
    assert score.provenance["skipped"] == ["only_long"]
    assert (long_one.value, dict(long_one.components)) == (2.0, {"only_long": 2.0, "short": 0.0})
    (nothing,) = grade_all(FunctionGrader([only_long, never], group_size=1), task(), "4")
    assert (nothing.value, nothing.status) == (None, "error")
    assert nothing.explanation == "no reward: only_long, never returned None"


def test_a_failing_function_fails_the_grade_naming_it_never_a_partial_sum():
    def boom(prompt, completion):
        raise ValueError("bad\ninput")

    def wrong_length(completions):
        return [1.0]

    (score,) = grade_all(FunctionGrader([has_four, boom]), task(), "4")
    assert (score.value, score.status) == (None, "error")
    assert score.explanation == "boom raised ValueError: bad input"
    scores = grade_all(FunctionGrader([has_four, wrong_length], group_size=2), task(), "4", "5")
    assert [s.status for s in scores] == ["error", "error"]
    assert scores[0].explanation == ("wrong_length returned [1.0] for 2 completions, not a list "
                                     "of 2 numbers")  # fmt: skip
    nan_ = FunctionGrader([has_four, lambda completions: [float("nan")]], group_size=1)
    (nan,) = grade_all(nan_, task(), "4")
    assert nan.explanation == "lambda returned nan, not a finite number or None"


def test_batched_functions_are_called_once_per_group_by_keyword_as_trl_calls_them():
    calls = []

    def batched(prompts, completions, completion_ids, answer, **kwargs):
        calls.append((prompts, completions, completion_ids, answer, kwargs))
        return np.array([len(c) for c in completions], dtype=float)  # an array is a list

    async def only_completions(completions):
        calls.append(completions)
        return [0.0] * len(completions)

    grader = FunctionGrader([batched, only_completions], group_size=3)
    t = task(level=2)
    scores = grade_all(grader, t, "a", "bb", "ccc")
    assert [s.components["batched"] for s in scores] == [1.0, 2.0, 3.0]
    assert calls == [
        (["2 + 2 ="] * 3, ["a", "bb", "ccc"], [[0, 7], [1, 7], [2, 7]], ["4"] * 3,
         {"level": [2, 2, 2]}),
        ["a", "bb", "ccc"],
    ]  # fmt: skip
    assert grader.supports_groups and is_batched(short) and not is_batched(has_four)


def test_chat_prompts_give_messages_and_a_one_message_completion_as_trl_does():
    seen = []

    def per_sample(prompt, completion):
        seen.append((prompt, completion))
        return 1.0

    def batched(prompts, completions):
        seen.append((prompts, completions))
        return [1.0] * len(completions)

    grade_all(FunctionGrader([per_sample, batched], group_size=1), task(CHAT), "4")
    reply = [{"role": "assistant", "content": "4"}]
    assert len(seen) == 2 and (CHAT, reply) in seen and ([CHAT], [reply]) in seen
    seen.clear()
    grade_all(FunctionGrader(per_sample), task("plain"), "4")
    assert seen == [("plain", "4")]  # a string prompt stays a string


@pytest.mark.parametrize(
    ("reward", "weights", "error"),
    [
        ([has_four, short], [1.0], "reward_weights: 1 weights for 2 reward functions"),
        ([has_four], [float("inf")], "reward_weights: inf is not a finite number"),
        ([], None, "reward: an empty list"),
        ([has_four, "short"], None, "reward: expected a function, got str"),
    ],
)
def test_bad_functions_and_weights_are_one_line_errors(reward, weights, error):
    with pytest.raises((TypeError, ValueError), match=f"^{error}"):
        FunctionGrader(reward, weights)


def test_rows_are_checked_against_each_signature():
    def needs_solution(completions, solution, **kwargs):
        return [1.0] * len(completions)

    with pytest.raises(DataError, match=r"^tasks\[0\]: reward needs_solution\(completions, "):
        register_function_env([has_four, needs_solution], [{"prompt": "p", "answer": "4"}])
    rows = [{"prompt": "p", "answer": "4", "completions": "x"}]
    with pytest.raises(DataError, match=r"^tasks\[0\]: field 'completions': reserved"):
        register_function_env(short, rows)


@pytest.mark.slow  # the registry loads the built-in environments
def test_the_env_id_is_readable_and_the_fingerprint_tells_rows_apart():
    rows = [{"prompt": "1 + 3 =", "answer": "4"}]
    first = register_function_env([has_four, short], rows, weights=[1.0, 0.5])
    again = register_function_env([has_four, short], rows, weights=[1.0, 0.5])
    other = register_function_env([has_four, short], [{"prompt": "2 + 2 =", "answer": "4"}])
    assert first == again and first.env_id == other.env_id == "reward.has_four.short-v1"
    assert first.kwargs != other.kwargs and set(first.kwargs) == {"fingerprint"}
    assert make_env(first.env_id, **first.kwargs).tasks()[0].prompt == "1 + 3 ="
    assert make_env(other.env_id, **other.kwargs).tasks()[0].prompt == "2 + 2 ="
    with pytest.raises(EnvKwargsError, match="not reward functions and rows given to train"):
        make_env(first.env_id, fingerprint="0" * 12)
    config = with_reward(as_config({}), [has_four, short], rows, None, [1.0, 0.5])
    assert (config.env.id, config.env.kwargs) == (first.env_id, first.kwargs)
    # the config a run wrote (env.kwargs its fingerprint) is taken back as it is
    assert with_reward(config, [has_four, short], rows, None, [1.0, 0.5]) == config
