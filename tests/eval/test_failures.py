"""Failure-mode analysis: causes per sample, grouping with counts and examples, the ledger."""

from __future__ import annotations

from rldojo.eval.failures import (
    failure_causes,
    failures_markdown,
    group_failures,
    normalise_message,
    records_from_ledger,
)
from rldojo.store.ledger import Ledger
from rldojo.types import Rollout, Score


def _rec(**kw):
    base = {
        "task_id": "t",
        "env": "arith-v1",
        "status": "ok",
        "score_status": "ok",
        "passed": False,
    }
    return base | kw


def test_causes_of_each_kind():
    assert failure_causes(_rec(passed=True)) == []
    assert failure_causes(_rec(components={"correct": 0.0, "format": 1.0})) == [
        "component:correct=0",
        "wrong_answer",
    ]
    no_format = failure_causes(_rec(components={"correct": 0.0, "format": 0.0}))
    assert "component:format=0" in no_format and "wrong_answer" not in no_format
    crashed = failure_causes(_rec(status="env_error", error="OSError: /tmp/x/y.db locked 3"))
    assert crashed == ["rollout:env_error", "error:OSError: <path> locked <n>"]
    graded = failure_causes(_rec(score_status="timeout", explanation="took longer than 30s"))
    assert graded == ["grade:timeout", "grade_error:took longer than <n>s"]
    flagged = failure_causes(_rec(flags=["hack:test_tamper"], info={"tool_errors": 2}))
    assert flagged == ["flag:hack:test_tamper", "tool:tool_errors"]
    assert "truncated" in failure_causes(_rec(info={"truncated_turns": 1}))


def test_normalise_message_groups_alike_errors():
    a = normalise_message("KeyError: 'user_17' at line 42")
    assert a == normalise_message("KeyError: 'user_99' at line 7")


def test_group_failures_counts_shares_and_examples():
    records = (
        [
            _rec(
                task_id=f"t{i}",
                components={"correct": 0.0, "format": float(i % 2)},
                completion=f"c{i}",
            )
            for i in range(6)
        ]
        + [_rec(env="code-v1", status="timeout", error="timeout after 10s")]
        + [_rec(passed=True)]
    )
    groups = group_failures(records, examples=2)
    top = groups[0]
    assert (top.env, top.cause, top.count, top.share) == ("arith-v1", "component:correct=0", 6, 1.0)
    by_cause = {(g.env, g.cause): g for g in groups}
    assert by_cause[("arith-v1", "component:format=0")].count == 3
    assert by_cause[("arith-v1", "wrong_answer")].count == 3
    assert by_cause[("code-v1", "rollout:timeout")].share == 1.0
    assert len(top.examples) == 2 and top.examples[0]["task_id"] == "t0"
    md = failures_markdown(groups)
    assert md.startswith("| env | cause |") and "`component:format=0`" in md


def test_records_from_ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    rollouts = [Rollout(f"t{i}", "arith-v1", [], f"Answer: {i}") for i in range(3)]
    scores = [
        Score(1.0, components={"correct": 1.0, "format": 1.0}),
        Score(-0.5, components={"correct": 0.0, "format": 0.0}),
        Score.failed("error", "math-verify: crashed"),
    ]
    ledger.add(0, rollouts, scores)
    ledger.close()
    records = records_from_ledger(tmp_path)
    assert [r["passed"] for r in records] == [True, False, False]
    causes = {g.cause for g in group_failures(records)}
    assert {"component:format=0", "grade:error", "grade_error:math-verify: crashed"} <= causes
