"""Noise ceiling: ceiling, adjusted score against simulation, label-error files and votes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rldojo.data.loading import DataError
from rldojo.eval.noise import estimate_label_errors, load_label_errors, noise_ceiling


def test_known_errors_give_ceiling_and_clean_accuracy():
    outcomes = {f"t{i}": i < 8 and i != 3 for i in range(10)}  # t8, t9 mislabelled: always "wrong"
    result = noise_ceiling(outcomes, {"t8": 1.0, "t9": 1.0})
    assert result.ceiling == pytest.approx(0.8)
    assert result.observed == pytest.approx(0.7)
    assert result.clean_accuracy == pytest.approx(7 / 8) and result.clean_n == 8
    assert result.adjusted == pytest.approx(7 / 8)  # c = 0: adjusted = clean accuracy
    assert result.relative == pytest.approx(0.7 / 0.8)
    perfect = noise_ceiling({f"t{i}": i < 8 for i in range(10)}, {"t8": 1.0, "t9": 1.0})
    assert perfect.observed == perfect.ceiling and perfect.adjusted == 1.0


@pytest.mark.slow
def test_adjusted_score_recovers_true_accuracy_in_simulation():
    # Multiple choice with 4 options: a wrong answer hits the wrong label 1/3 of the time.
    rng = np.random.default_rng(0)
    n, true_acc, err = 20_000, 0.6, 0.15
    mislabelled = rng.random(n) < err
    right = rng.random(n) < true_acc
    hits_wrong_label = rng.random(n) < 1 / 3
    observed = np.where(mislabelled, ~right & hits_wrong_label, right)
    outcomes = {str(i): bool(x) for i, x in enumerate(observed)}
    result = noise_ceiling(outcomes, {str(i): err for i in range(n)}, chance=1 / 3, n_resamples=200)
    assert result.observed < true_acc - 0.05  # the noise really hides accuracy
    assert result.adjusted == pytest.approx(true_acc, abs=0.015)
    assert result.adjusted_ci95[0] < true_acc < result.adjusted_ci95[1]


def test_label_errors_from_strong_grader_votes():
    refs = {"a": "12", "b": "7", "c": "3", "d": "1"}
    votes = {"a": ["12", "12.0", "12"], "b": ["8", "8", "7"], "c": ["3"], "d": ["2", "5", "9"]}
    share = estimate_label_errors(refs, votes)
    assert share == {"a": 0.0, "b": pytest.approx(2 / 3), "d": 1.0}  # c: too few votes
    hard = estimate_label_errors(refs, votes, mode="majority")
    assert hard == {"a": 0.0, "b": 1.0, "d": 0.0}  # d: graders disagree among themselves


def test_load_label_errors_file_formats(tmp_path):
    path = tmp_path / "errors.jsonl"
    rows = [
        {"task_id": "a", "p_error": 0.25},
        {"id": "b", "mislabeled": True},
        {"task_id": "c", "votes": ["4", "4"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert load_label_errors(path, {"c": "5"}) == {"a": 0.25, "b": 1.0, "c": 1.0}
    path.write_text(json.dumps({"task_id": "a", "p_error": 2}))
    with pytest.raises(DataError, match=r"errors\.jsonl:1.*p_error"):
        load_label_errors(path)
