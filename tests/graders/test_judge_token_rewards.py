"""Per-token rewards: character spans of the completion mapped onto its tokens."""

from __future__ import annotations

import asyncio

import pytest
from judge_standin import StandinJudge

from rldojo.graders import Criterion, EngineJudge, JudgeClient, RubricGrader, load
from rldojo.graders.token_rewards import (
    SpanPenaltyGrader,
    final_turn_range,
    quote_spans,
    spans_to_token_rewards,
    token_char_ranges,
)
from rldojo.inference import ScriptedEngine
from rldojo.types import Rollout, Score, Task

pytestmark = pytest.mark.slow  # tiny-random's tokenizer

TASK = Task(id="t", prompt="7 + 5?", answer="12")


class Fixed:
    name = "fixed"

    async def grade(self, rollout, task):
        return Score(0.5, components={"c": 0.5})


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return tiny[1]


def rollout_for(tokenizer, text, eos=True, prefix_ids=()):
    ids = list(prefix_ids) + tokenizer(text, add_special_tokens=False)["input_ids"]
    if eos:
        ids.append(tokenizer.eos_token_id)
    mask = [False] * len(prefix_ids) + [True] * (len(ids) - len(prefix_ids))
    return Rollout(
        task_id="t",
        env="e",
        messages=[],
        completion=text,
        completion_ids=tuple(ids),
        policy_mask=tuple(mask),
    )


def penalised_text(tokenizer, rollout, rewards):
    return "".join(
        tokenizer.decode([tok]) for tok, r in zip(rollout.completion_ids, rewards, strict=True) if r
    )


def test_char_ranges_cover_the_decoded_text(tokenizer):
    ids = tokenizer("Héllo wörld 12 + 13", add_special_tokens=False)["input_ids"]
    text, ranges = token_char_ranges(tokenizer, ids)
    assert text == "Héllo wörld 12 + 13"
    assert ranges[0][0] == 0 and ranges[-1][1] == len(text)
    assert all(a <= b for a, b in ranges)
    assert "".join(text[a:b] for a, b in ranges) == text


def test_span_maps_to_exactly_the_overlapping_tokens(tokenizer):
    text = "First 7 + 5 = 13, so the answer is 12."
    rollout = rollout_for(tokenizer, text)
    start = text.index("13")
    rewards = spans_to_token_rewards(tokenizer, rollout, [(start, start + 2, -0.5)])
    assert rewards is not None and len(rewards) == len(rollout.completion_ids)
    assert set(rewards) == {0.0, -0.5}
    assert "13" in penalised_text(tokenizer, rollout, rewards)
    assert "12" not in penalised_text(tokenizer, rollout, rewards)
    assert rewards[-1] == 0.0  # eos untouched


def test_only_the_final_policy_turn_is_mapped(tokenizer):
    earlier = tokenizer("13 13 13 tool says hi", add_special_tokens=False)["input_ids"]
    rollout = rollout_for(tokenizer, "answer 13", prefix_ids=earlier)
    assert final_turn_range(rollout) == (len(earlier), len(rollout.completion_ids))
    rewards = spans_to_token_rewards(tokenizer, rollout, [(7, 9, -1.0)])
    assert rewards is not None and not any(rewards[: len(earlier)])
    assert "13" in penalised_text(tokenizer, rollout, rewards)


def test_unalignable_or_tokenless_rollouts_get_none(tokenizer):
    plain = Rollout(task_id="t", env="e", messages=[], completion="x")
    assert spans_to_token_rewards(tokenizer, plain, [(0, 1, -1.0)]) is None
    wrong = rollout_for(tokenizer, "abc")
    wrong = Rollout(**{**wrong.__dict__, "completion": "something else"})
    assert spans_to_token_rewards(tokenizer, wrong, [(0, 1, -1.0)]) is None


def test_quote_spans_are_whitespace_insensitive():
    text = "a hallucinated\nfact here and a hallucinated fact there"
    assert quote_spans(text, "hallucinated fact", -1.0) == [(2, 19, -1.0), (31, 48, -1.0)]
    assert quote_spans(text, "  ", -1.0) == []


def test_span_penalty_grader_keeps_the_sequence_score(tokenizer):
    grader = SpanPenaltyGrader(Fixed(), {r"(?i)as an ai": -0.25}, tokenizer)
    rollout = rollout_for(tokenizer, "As an AI, I think 12.")
    score = asyncio.run(grader.grade(rollout, TASK))
    assert score.value == 0.5 and score.components["penalised_spans"] == 1.0
    assert score.token_rewards is not None
    assert penalised_text(tokenizer, rollout, score.token_rewards).strip().lower() == "as an ai"
    clean = asyncio.run(grader.grade(rollout_for(tokenizer, "12."), TASK))
    assert clean.token_rewards is None and clean.value == 0.5


def test_span_penalty_from_a_spec(tokenizer, tmp_path):
    spec = {
        "type": "span_penalty",
        "tokenizer": "tiny-random",
        "patterns": {"13": -1.0},
        "grader": {"type": "exact_match"},
    }
    grader = load(spec, cache=False)
    rollout = rollout_for(tokenizer, "13, no.\nAnswer: 12")
    score = asyncio.run(grader.grade(rollout, TASK))
    assert score.value == 1.0 and score.token_rewards is not None
    assert penalised_text(tokenizer, rollout, score.token_rewards).strip() == "13"


def test_rubric_judge_quotes_become_token_rewards(tokenizer):
    judge = JudgeClient(EngineJudge(ScriptedEngine(StandinJudge())))
    grader = RubricGrader(
        judge,
        [Criterion("right", 'says "12"', 4), Criterion("wrong_step", 'claims "5 = 13"', -2)],
        tokenizer=tokenizer,
    )
    rollout = rollout_for(tokenizer, "7 + 5 = 13, hence 12")
    score = asyncio.run(grader.grade(rollout, TASK))
    assert score.value == pytest.approx((4 - 2) / 4)
    assert score.token_rewards is not None
    assert set(score.token_rewards) == {0.0, -0.5}  # -2 points / 4 positive points
    assert penalised_text(tokenizer, rollout, score.token_rewards).strip() == "5 = 13"
