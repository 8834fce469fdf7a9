"""Group judging: one call scores every sample of a group; shared text shown once."""

from __future__ import annotations

import asyncio

import pytest
from judge_standin import StandinJudge

from rldojo.graders import GroupJudgeGrader, load
from rldojo.graders.judges.group import shared_prefix
from rldojo.graders.judges.injection import VerdictError
from rldojo.inference import ScriptedEngine, start_server
from rldojo.types import Rollout, Task

TASK = Task(id="g1", prompt="What is 7 + 5? Explain.", answer="12")
INSTRUCTIONS = 'Prefer answers that say "12" and explain "because".'


@pytest.fixture(scope="module")
def server():
    engine = ScriptedEngine(StandinJudge())
    with start_server(engine) as handle:
        yield handle


def group_spec(server, **extra):
    return {
        "type": "group_judge",
        "judge": {"base_url": server.url, "model": server.model},
        "instructions": INSTRUCTIONS,
        **extra,
    }


def rollouts(*texts, seed=0):
    return [
        Rollout(task_id=TASK.id, env="e", messages=[], completion=t, sample_index=i, seed=seed)
        for i, t in enumerate(texts)
    ]


def test_one_call_scores_the_whole_group(server):
    grader = load(group_spec(server), cache=False)
    before = server.engine.calls
    group = rollouts("12 because 7 + 5 = 12", "12", "13", "12")
    scores = asyncio.run(grader.grade_group(group, TASK))
    assert server.engine.calls == before + 1
    # share of the two keywords each sample contains
    assert [s.value for s in scores] == [1.0, 0.5, 0.0, 0.5]
    assert all(s.status == "ok" for s in scores)
    prompt = server.engine.requests[-1].messages[1]["content"]
    assert prompt.count("<<<S") == 3  # the duplicate "12" is shown once
    assert scores[1].provenance["label"] == scores[3].provenance["label"]
    assert scores[0].provenance["group_size"] == 4


def test_shared_prefix_is_shown_once(server):
    head = "Let me work through this carefully, step by step, to be sure of it. "
    assert len(head) >= 64
    grader = load(group_spec(server), cache=False)
    scores = asyncio.run(grader.grade_group(rollouts(head + "12 because", head + "It is 13"), TASK))
    prompt = server.engine.requests[-1].messages[1]["content"]
    assert prompt.count(head.strip()) == 1 and "<<<SHARED " in prompt
    assert [s.value for s in scores] == [1.0, 0.0]


def test_shared_prefix_helper():
    assert shared_prefix(["abc", "abd"]) == ""  # too short to bother
    long = "x " * 40
    assert shared_prefix([long + "one", long + "two"], min_chars=10) == long
    assert shared_prefix(["same " * 20], min_chars=1) == ""  # one text: nothing shared


def test_presentation_order_is_shuffled_deterministically_or_as_asked(server):
    grader = GroupJudgeGrader(None, shuffle=True)  # type: ignore[arg-type]
    texts = [f"sample {i}" for i in range(6)]
    assert grader.presentation(texts, None) == grader.presentation(texts, None)
    assert grader.presentation(texts, None) != texts
    assert grader.presentation(texts, [5, 4, 3, 2, 1, 0]) == texts[::-1]


def test_per_sample_protocol_gathers_the_group(server):
    grader = load(group_spec(server, group_size=3), cache=False)
    group = rollouts("12 because", "12", "nothing", seed=9)

    async def concurrently():
        return await asyncio.gather(*(grader.grade(r, TASK) for r in group))

    before = server.engine.calls
    scores = asyncio.run(concurrently())
    assert server.engine.calls == before + 1
    assert [s.value for s in scores] == [1.0, 0.5, 0.0]


def test_gather_window_when_group_size_is_unknown(server):
    grader = load(group_spec(server, gather_window_s=0.05), cache=False)

    async def staggered():
        a = asyncio.ensure_future(grader.grade(rollouts("12 because")[0], TASK))
        # One turn of the loop: `a` arrives and arms the window, then `b` comes. (A timed
        # sleep could outlast the window on a loaded machine; `b`'s turn, already queued,
        # runs before the window's timer however long the loop stalls.)
        await asyncio.sleep(0)
        b = asyncio.ensure_future(grader.grade(rollouts("x", "12")[1], TASK))
        return await asyncio.gather(a, b)

    before = server.engine.calls
    scores = asyncio.run(staggered())
    assert server.engine.calls == before + 1
    assert [s.value for s in scores] == [1.0, 0.5]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (
            '{"group_id": "n", "scores": [{"sample": "S1", "score": 0.5}]}',
            r"missing scores for \['S2'\]",
        ),
        (
            '{"group_id": "n", "scores": [{"sample": "S1", "score": 2}, '
            '{"sample": "S2", "score": 0}]}',
            "outside",
        ),
        ('{"group_id": "n", "scores": [{"sample": "S9", "score": 1}]}', "unknown sample label"),
        ('{"group_id": "x", "scores": []}', "'group_id' must be 'n'"),
    ],
)
def test_strict_group_verdicts(reply, message):
    with pytest.raises(VerdictError, match=message):
        GroupJudgeGrader.parse(reply, "n", ["S1", "S2"])


@pytest.mark.slow
def test_bad_group_reply_is_invalid_for_every_sample():
    engine = ScriptedEngine(lambda r: '{"scores": "great"}')
    with start_server(engine) as server:
        grader = load(group_spec(server), cache=False)
        scores = asyncio.run(grader.grade_group(rollouts("a", "b"), TASK))
    assert [s.status for s in scores] == ["invalid", "invalid"]
    assert all(s.value is None for s in scores)
