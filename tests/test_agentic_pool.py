"""benchmarks/agentic_pool.py: seeds' 2x2 tables rebuilt from their results files, pooled."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import agentic_pipeline as ap
import agentic_pool


def _result(sft: dict[str, bool], rl: dict[str, bool]) -> dict:
    """A results file's fields as `agentic_pipeline.run_pipeline` writes them."""
    return {"success": {"sft": ap._rate(sft), "sft_rl": ap._rate(rl)},
            "paired": {"sft_to_sft_rl": ap._paired(sft, rl)},
            "overrides": [], "machine": {"cpu_flags": ["avx2"]}}  # fmt: skip


def test_pooling_equals_the_paired_statistics_on_all_games(tmp_path):
    rng = random.Random(3)
    games = [({f"g{i}": rng.random() < 0.5 for i in range(n)}) for n in (40, 60)]
    rls = [{k: (v if rng.random() < 0.7 else not v) for k, v in g.items()} for g in games]
    paths = []
    for j, (sft, rl) in enumerate(zip(games, rls, strict=True)):
        paths.append(tmp_path / f"seed{j}.json")
        paths[-1].write_text(json.dumps(_result(sft, rl)))
        cells = agentic_pool.table(json.loads(paths[-1].read_text()))
        assert sorted(cells) == sorted((sft[k], rl[k]) for k in sft)  # the same 2x2 table
    pooled = agentic_pool.pool(paths)
    all_sft = {f"{j}:{k}": v for j, g in enumerate(games) for k, v in g.items()}
    all_rl = {f"{j}:{k}": v for j, g in enumerate(rls) for k, v in g.items()}
    assert pooled["sft"] == ap._rate(all_sft) and pooled["sft_rl"] == ap._rate(all_rl)
    want, got = ap._paired(all_sft, all_rl), pooled["sft_to_sft_rl"]
    assert got["n"] == 100 and got["mcnemar"] == want["mcnemar"]
    assert got["diff"] == pytest.approx(want["diff"])


def test_counts_that_disagree_are_refused():
    sft, rl = {"a": True, "b": False}, {"a": True, "b": True}
    result = _result(sft, rl)
    result["success"]["sft_rl"]["passed"] = 1  # the McNemar cells say 2
    with pytest.raises(ValueError, match="disagree"):
        agentic_pool.table(result)
