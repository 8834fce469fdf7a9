"""Pipeline replications pooled (`benchmarks/agentic_pool.py`): seeds' 2x2 tables rebuilt
from their summaries, pooled (`rldojo.eval.compare`)."""

from __future__ import annotations

import json
import random

import pytest

from rldojo.eval.compare import paired_comparison, pool_pairs, success_rate, summary_pairs


def _result(sft: dict[str, bool], rl: dict[str, bool]) -> dict:
    """A pipeline summary's fields (`rldojo.training.pipeline.summarize`)."""
    return {"success": {"sft": success_rate(sft), "sft_rl": success_rate(rl)},
            "paired": {"sft_to_sft_rl": paired_comparison(sft, rl)}}  # fmt: skip


def test_pooling_equals_the_paired_statistics_on_all_games(tmp_path):
    rng = random.Random(3)
    games = [({f"g{i}": rng.random() < 0.5 for i in range(n)}) for n in (40, 60)]
    rls = [{k: (v if rng.random() < 0.7 else not v) for k, v in g.items()} for g in games]
    tables = {}
    for j, (sft, rl) in enumerate(zip(games, rls, strict=True)):
        path = tmp_path / f"seed{j}.json"  # the pairs survive the results file
        path.write_text(json.dumps(_result(sft, rl)))
        tables[path.name] = summary_pairs(json.loads(path.read_text()))
        assert sorted(tables[path.name]) == sorted((sft[k], rl[k]) for k in sft)  # one 2x2
    pooled = pool_pairs(tables)
    all_sft = {f"{j}:{k}": v for j, g in enumerate(games) for k, v in g.items()}
    all_rl = {f"{j}:{k}": v for j, g in enumerate(rls) for k, v in g.items()}
    assert pooled["sft"] == success_rate(all_sft) and pooled["sft_rl"] == success_rate(all_rl)
    want, got = paired_comparison(all_sft, all_rl), pooled["sft_to_sft_rl"]
    assert got["n"] == 100 and got["mcnemar"] == want["mcnemar"]
    assert got["diff"] == pytest.approx(want["diff"])


def test_counts_that_disagree_are_refused():
    sft, rl = {"a": True, "b": False}, {"a": True, "b": True}
    result = _result(sft, rl)
    result["success"]["sft_rl"]["passed"] = 1  # the McNemar cells say 2
    with pytest.raises(ValueError, match="disagree"):
        summary_pairs(result)
