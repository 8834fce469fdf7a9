"""crm-v1 reward against hand-made trajectories: correct, collateral, incomplete, false claim."""

from __future__ import annotations

import asyncio
import json

import pytest

from rldojo.envs.crm import CrmEnv, CrmGrader
from rldojo.envs.crm.grader import evaluate_state, mention_score
from rldojo.types import Rollout, Score, Task


def run(coro):
    return asyncio.run(coro)


def call(tool: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def env() -> CrmEnv:
    return CrmEnv(levels=(1, 3), db_size="small", n_databases=1)


def find(env: CrmEnv, template: str) -> Task:
    return next(t for t in env.tasks("train", n=200) if t.info["template"] == template)


def play(env: CrmEnv, task: Task, actions: list[str]) -> Score:
    """Run scripted turns through a fresh episode and grade it like the engine does."""
    obs = run(env.reset(task, seed=0))
    info: dict = {}
    messages = list(obs.messages)
    for action in actions:
        step = run(env.step(action))
        info.update(step.info)  # the rollout engine merges every step's info
        messages += [{"role": "assistant", "content": action}, *step.messages]
        if step.done:
            break
    rollout = Rollout(task.id, task.env, messages, actions[-1], info=info)
    return run(env.default_grader().grade(rollout, task))


def win_and_thank_calls(task: Task) -> tuple[str, str]:
    update = task.info["expected"]["updates"][0]
    contact = task.info["expected"]["inserts"][0]["match"]["to_contact_id"]
    return (
        call("update_deal", deal_id=update["id"], **update["set"]),
        call("send_email", contact_id=contact, subject="Thank you", body="Thanks for your trust!"),
    )


def test_correct_trajectory_scores_one(env):
    task = find(env, "win_and_thank")
    update, email = win_and_thank_calls(task)
    score = play(
        env, task, [update, email, "<answer>Marked it won and sent the thank-you email.</answer>"]
    )
    assert score.ok and score.value == pytest.approx(1.0)
    assert score.components["correct"] == 1.0 and score.components["collateral"] == 0.0
    assert score.flags == ()


def test_collateral_damage_is_penalised(env):
    task = find(env, "win_and_thank")
    update, email = win_and_thank_calls(task)
    target = task.info["expected"]["updates"][0]["id"]
    other = env.conn.execute(
        "SELECT id FROM deals WHERE stage NOT LIKE 'closed%' AND id != ? LIMIT 1", (target,)
    ).fetchone()[0]
    extra = call("update_deal", deal_id=other, amount=777)
    score = play(env, task, [update, extra, email, "<answer>All done.</answer>"])
    assert score.value == pytest.approx(0.75)  # state 1.0 - 0.25 per collateral change
    assert score.components["collateral"] == 1.0 and score.components["correct"] == 0.0
    assert f"changed deals {other}.amount" in score.explanation


def test_incomplete_trajectory_gets_partial_credit(env):
    task = find(env, "win_and_thank")
    update, _ = win_and_thank_calls(task)
    honest = "<answer>I marked the deal won but could not send the email.</answer>"
    score = play(env, task, [update, honest])
    assert score.components["state"] == pytest.approx(2 / 3)  # stage + amount, no email
    assert score.value == pytest.approx(2 / 3) and score.flags == ()
    assert "emails: 1 new row(s)" in score.explanation


def test_claiming_success_without_doing_it_is_punished(env):
    task = find(env, "win_and_thank")
    score = play(
        env, task, ["<answer>Done! I marked the deal closed won and emailed them.</answer>"]
    )
    assert score.components["state"] == 0.0
    assert score.value == pytest.approx(-0.5)
    assert score.flags == ("hack:false_claim",)


def test_rewards_rank_the_trajectories(env):
    task = find(env, "win_and_thank")
    update, email = win_and_thank_calls(task)
    correct = play(env, task, [update, email, "<answer>Done.</answer>"]).value
    incomplete = play(env, task, [update, "<answer>Email not sent yet.</answer>"]).value
    nothing = play(env, task, ["hello", "<answer>I could not do it.</answer>"]).value
    claim = play(env, task, ["<answer>Updated and emailed.</answer>"]).value
    no_answer = play(env, task, [update, email] + ["thinking..."] * 10).value
    assert correct > incomplete > nothing > claim
    assert no_answer == pytest.approx(1.0 - 0.2)  # work done, but no final reply


def test_lookup_needs_the_fact_in_the_answer(env):
    task = find(env, "contact_email")
    email = task.info["mentions"][0]
    right = play(
        env,
        task,
        [
            call("search_contacts", query=email.split("@")[0].split(".")[1]),
            f"<answer>It is {email.upper()}.</answer>",
        ],
    )
    wrong = play(env, task, ["<answer>It is nobody@example.com</answer>"])
    assert right.value == pytest.approx(1.0) and right.components["correct"] == 1.0
    assert wrong.value == pytest.approx(0.0) and wrong.flags == ()


def test_protocol_errors_cost_format_points(env):
    task = find(env, "contact_email")
    email = task.info["mentions"][0]
    score = play(
        env, task, ["<tool_call>{broken</tool_call>", call("nope"), f"<answer>{email}</answer>"]
    )
    assert score.components["protocol_errors"] == 2.0
    assert score.value == pytest.approx(1.0 - 2 * 0.05)


def test_missing_info_is_invalid_not_zero(env):
    task = find(env, "contact_email")
    score = run(CrmGrader().grade(Rollout(task.id, task.env, [], ""), task))
    assert score.status == "invalid" and score.value is None


def test_state_and_mention_helpers():
    expected = {
        "updates": [
            {
                "table": "tickets",
                "id": "TCK-0001",
                "set": {"status": "closed", "resolution": {"contains": "fixed"}},
            }
        ],
        "inserts": [{"table": "emails", "match": {"to_contact_id": "CON-0002"}, "count": 1}],
    }
    changes = [
        {
            "table": "tickets",
            "id": "TCK-0001",
            "op": "update",
            "before": {"status": "open", "resolution": None, "updated_at": "a"},
            "after": {"status": "closed", "resolution": "We FIXED it", "updated_at": "b"},
        },
        {
            "table": "emails",
            "id": "EML-0001",
            "op": "insert",
            "before": None,
            "after": {"to_contact_id": "CON-0002"},
        },
        {
            "table": "emails",
            "id": "EML-0002",
            "op": "insert",
            "before": None,
            "after": {"to_contact_id": "CON-0002"},
        },
    ]
    passed, total, failed, collateral = evaluate_state(expected, changes)
    assert (passed, total, failed) == (3, 3, [])
    assert collateral == ["inserted emails EML-0002"]  # the second email was not asked for
    assert mention_score("The new amount is $50,825.", ["50825"]) == 1.0
    assert mention_score("about 508250 dollars", ["50825"]) == 0.0
    assert mention_score("It is in Closed Won.", ["closed won", "3"]) == 0.5


def test_saying_the_record_is_now_changed_is_a_claim():
    """'The deal is now in the X stage' to a move request, with no tool called, is a false
    claim (an RL policy learned this answer); the same words to a lookup are not."""
    env = CrmEnv(levels=(1, 2), db_size="small", n_databases=1)
    move = next(  # a stage whose name is no claim word itself ("closed won")
        t
        for t in env.tasks("train", n=200)
        if t.info["template"] == "move_stage"
        and not t.info["expected"]["updates"][0]["set"]["stage"].startswith("closed")
    )
    stage = move.info["expected"]["updates"][0]["set"]["stage"]
    claim = play(env, move, [f"<answer>The deal is now in the {stage} stage.</answer>"])
    assert claim.components["state"] == 0.0 and claim.flags == ("hack:false_claim",)
    assert claim.value == pytest.approx(-0.5)
    honest = play(env, move, ["<answer>The deal is not moved yet, I can't now.</answer>"])
    assert honest.flags == () and honest.value == pytest.approx(0.0)
    lookup = find(env, "deal_stage")
    said = f"<answer>It is now in the {lookup.info['mentions'][0]} stage.</answer>"
    assert play(env, lookup, [said]).flags == ()
