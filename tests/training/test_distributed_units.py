"""The pure parts of sharded training: how a step's rows are dealt to ranks, and the
one-line refusals before any process group or model exists."""

from __future__ import annotations

import pytest
import torch

from rldojo.config import ConfigValueError
from rldojo.training.distributed import Dist, init_dist, one_rank, rank_micro_batches

STEP = [[4, 1], [0, 3], [2]]  # an sft_schedule step: rows longest first, micro-batches of 2


def test_one_rank_keeps_the_steps_own_micro_batches():
    assert rank_micro_batches(STEP, Dist(), 2) == ([[4, 1], [0, 3], [2]], 0)


def test_rows_are_dealt_round_the_ranks_and_the_short_rank_pads_at_weight_zero():
    rank0 = rank_micro_batches(STEP, Dist(rank=0, world=2, sharded=True), 2)
    rank1 = rank_micro_batches(STEP, Dist(rank=1, world=2, sharded=True), 2)
    assert rank0 == ([[4, 0], [2]], 0)  # rows 4, 0, 2: the 1st, 3rd and 5th longest
    assert rank1 == ([[1, 3], [4]], 1)  # rows 1, 3, then a repeat of row 4 at weight 0
    dealt = [i for mbs, pad in (rank0, rank1) for mb in mbs[: len(mbs) - pad] for i in mb]
    assert sorted(dealt) == [0, 1, 2, 3, 4]  # every row once, on one rank


def test_three_ranks_each_take_the_same_number_of_forward_passes():
    counts = {len(rank_micro_batches(STEP, Dist(rank=r, world=3, sharded=True), 1)[0])
              for r in range(3)}  # fmt: skip
    assert counts == {2}


def test_the_shard_setting_and_the_world_size_must_agree(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_dist("auto", torch.device("cpu"), 60).world == 1
    with pytest.raises(ConfigValueError, match=r"run\.shard = 'fsdp' needs several ranks"):
        init_dist("fsdp", torch.device("cpu"), 60)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigValueError, match=r"run\.shard = 'none' with 2 ranks"):
        init_dist("none", torch.device("cpu"), 60)
    with pytest.raises(ConfigValueError, match="rldojo train does not train on several ranks"):
        one_rank(Dist(rank=0, world=2, sharded=True), "rldojo train")
