"""String checks and similarity metrics, with hand-computed expected values."""

from __future__ import annotations

import math

import pytest

from rldojo.graders.text_metrics import (
    cosine_similarity,
    meteor_wordnet,
    similarity,
    string_check,
)

REF = "the cat sat on the mat"
HYP = "the cat sat"


@pytest.mark.parametrize(
    ("text", "ref", "op", "expected"),
    [
        ("Paris", "Paris", "eq", True),
        ("paris", "Paris", "eq", False),
        ("paris", "Paris", "ne", True),
        ("The capital is Paris.", "Paris", "like", True),
        ("The capital is paris.", "Paris", "like", False),
        ("The capital is paris.", "Paris", "ilike", True),
        ("Lyon", "Paris", "ilike", False),
    ],
)
def test_string_check(text, ref, op, expected):
    assert string_check(text, ref, op) is expected


def test_string_check_rejects_unknown_operation():
    with pytest.raises(ValueError, match="unknown string_check operation"):
        string_check("a", "a", "contains")


def test_fuzzy_match():
    assert similarity("fuzzy_match", "abc", "abc") == 1.0
    # Indel ratio: 2 * |LCS("abc", "abd")| / (3 + 3) = 4 / 6; WRatio keeps it for equal lengths
    assert similarity("fuzzy_match", "abc", "abd") == pytest.approx(4 / 6)


def test_bleu_is_brevity_penalty_for_a_correct_prefix():
    assert similarity("bleu", REF, REF) == pytest.approx(1.0)
    # every n-gram of the 3-word hypothesis is in the reference; BP = exp(1 - 6/3)
    assert similarity("bleu", HYP, REF) == pytest.approx(math.exp(-1))


def test_gleu_is_min_of_ngram_precision_and_recall():
    # hypothesis 1-4-grams: 3+2+1+0 = 6, all matched; reference: 6+5+4+3 = 18 -> 6/18
    assert similarity("gleu", HYP, REF) == pytest.approx(1 / 3)


def test_meteor_exact_matches():
    # identical 3 words: P = R = 1, one chunk -> penalty 0.5 * (1/3)^3
    assert similarity("meteor", HYP, HYP) == pytest.approx(1 - 0.5 / 27)
    assert meteor_wordnet()  # says which WordNet (or none) was used


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("rouge_1", 2 * 1.0 * 0.5 / 1.5),  # P = 3/3, R = 3/6
        ("rouge_2", 2 * 1.0 * 0.4 / 1.4),  # P = 2/2, R = 2/5
        ("rouge_3", 2 * 1.0 * 0.25 / 1.25),  # P = 1/1, R = 1/4
        ("rouge_4", 0.0),  # the hypothesis has no 4-grams
        ("rouge_5", 0.0),
        ("rouge_l", 2 * 1.0 * 0.5 / 1.5),  # LCS = 3
    ],
)
def test_rouge(metric, expected):
    assert similarity(metric, HYP, REF) == pytest.approx(expected)
    assert similarity(metric, REF, REF) == pytest.approx(1.0)


def test_cosine_and_unknown_metric():
    assert cosine_similarity([1, 0], [1, 0]) == 1.0
    assert cosine_similarity([2, 1], [1, 1]) == pytest.approx(3 / math.sqrt(10))
    assert cosine_similarity([0, 0], [1, 1]) == 0.0
    with pytest.raises(ValueError, match="embeddings"):
        similarity("cosine", "a", "b")
    with pytest.raises(ValueError, match="unknown evaluation_metric"):
        similarity("bertscore", "a", "b")
