"""crm-v1's per-turn credit: the expert's own episodes are on its path at every turn; the
turn that picks another tool is marked -1 and the turns after it 0; the grader puts the
weighted credit on each turn's tokens and leaves the outcome's value alone."""

from __future__ import annotations

import asyncio

from rldojo.envs.crm import CrmEnv
from rldojo.envs.crm.credit import turn_credits
from rldojo.envs.crm.expert import CrmExpert
from rldojo.envs.crm.grader import CrmGrader, CrmReward
from rldojo.envs.experts import tool_call_text
from rldojo.types import Rollout, Task

KWARGS = {"levels": [1, 2], "db_size": "default", "n_databases": 4,
          "schema_style": "signatures", "limits": {"max_turns": 4, "max_tokens": 6000}}  # fmt: skip


def _play(env: CrmEnv, task: Task, act) -> Rollout:
    """Play `act(messages, turn)` until the episode ends; the rollout the engine would build,
    with 3 token ids per policy turn (mask True) and 2 per environment turn (mask False)."""
    messages = list(asyncio.run(env.reset(task, seed=0)).messages)
    ids: list[int] = []
    mask: list[bool] = []
    info: dict = {}
    for turn in range(8):
        action = act(messages, turn)
        messages.append({"role": "assistant", "content": action})
        step = asyncio.run(env.step(action))
        info.update(step.info)
        ids += [7, 7, 7]
        mask += [True] * 3
        if step.done:
            break
        messages += step.messages
        ids += [9, 9]
        mask += [False] * 2
    return Rollout(task.id, task.env, messages, action, (1,), tuple(ids), tuple(mask), info=info)


def _expert(task: Task):
    return lambda messages, turn: CrmExpert().act(messages, task)


def test_the_experts_own_episodes_are_on_its_path_at_every_turn():
    env = CrmEnv(**KWARGS)
    turns = []
    for task in env.tasks("train", seed=0, n=16):
        credits = turn_credits(_play(env, task, _expert(task)).messages, task)
        assert credits == [1.0] * len(credits), task.info["template"]
        turns.append(len(credits))
    assert max(turns) >= 3  # some episodes have two tool turns before the answer


def test_a_wrong_second_tool_is_minus_one_and_the_grader_puts_it_on_that_turns_tokens():
    env = CrmEnv(**KWARGS)
    # a task whose expert calls a second tool after search_accounts (a deal's stage)
    task = next(t for t in env.tasks("train", seed=0, n=40) if t.info["template"] == "deal_stage")
    wrong = tool_call_text("create_ticket", {"account_id": "ACC-0001", "subject": "stage?"})

    def act(messages, turn):  # the expert's first turn, the wrong tool, then an answer
        return [CrmExpert().act(messages, task), wrong][turn] if turn < 2 else "<answer>x</answer>"

    rollout = _play(env, task, act)
    assert turn_credits(rollout.messages, task) == [1.0, -1.0, 0.0]
    plain = asyncio.run(CrmGrader().grade(rollout, task))
    assert plain.token_rewards is None and "turn_credit" not in plain.components
    score = asyncio.run(CrmGrader(CrmReward(turn_credit=0.5)).grade(rollout, task))
    assert score.value == plain.value  # the outcome's value is unchanged
    assert score.components["turn_credit"] == 0.0  # the mean of +1 and -1
    assert score.token_rewards == (0.5,) * 3 + (0.0,) * 2 + (-0.5,) * 3 + (0.0,) * 2 + (0.0,) * 3
