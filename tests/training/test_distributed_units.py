"""The pure parts of sharded training: how a step's rows are dealt to ranks, the
one-line refusals before any process group or model exists, and the group of one that
`run.shard = "fsdp"` makes in one process."""

from __future__ import annotations

import pytest
import torch

from rldojo.config import ConfigValueError, TrainConfig
from rldojo.training.distributed import (
    Dist,
    check_shardable,
    init_dist,
    rank_micro_batches,
)
from rldojo.training.rank_checkpoints import load_positional_optimizer_state, optimizer_state

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
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigValueError, match=r"run\.shard = 'none' with 2 ranks"):
        init_dist("none", torch.device("cpu"), 60)


def test_fsdp_in_one_process_shards_over_a_group_of_one(monkeypatch):
    """`run.shard = "fsdp"` without torchrun: a process group of one (FSDP's CPU offload on
    one GPU); closing the run leaves no group behind."""
    import torch.distributed as dist

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    if dist.is_initialized():
        pytest.skip("a process group exists in this process already")
    d = init_dist("fsdp", torch.device("cpu"), 60)
    try:
        assert (d.rank, d.world, d.sharded, d.main) == (0, 1, True, True)
        assert dist.is_initialized() and dist.get_world_size() == 1
        assert d.sum(2.0) == 2.0 and d.broadcast("x") == "x"
    finally:
        d.close()
    assert not dist.is_initialized()


def test_what_sharding_cannot_do_here_is_refused_in_one_line():
    cpu, cuda, two = torch.device("cpu"), torch.device("cuda"), Dist(rank=1, world=2, sharded=True)
    check_shardable(TrainConfig.model_validate({"model": {"lora": {"r": 8}}}), two, cpu)
    check_shardable(TrainConfig.model_validate({"run": {"checkpoint_format": "dcp"}}), two, cpu)
    both = {"model": {"lora": {"r": 8}}, "run": {"checkpoint_format": "dcp"}}
    with pytest.raises(ConfigValueError, match=r"run\.checkpoint_format = 'dcp' keeps whole"):
        check_shardable(TrainConfig.model_validate(both), two, cpu)
    offload = TrainConfig.model_validate({"run": {"cpu_offload": True}})
    check_shardable(offload, two, cuda)  # several CUDA ranks: what it is for
    check_shardable(offload, Dist(sharded=True), cuda)  # run.shard = "fsdp" on one GPU
    with pytest.raises(ConfigValueError, match=r"run\.cpu_offload .* the cpu device"):
        check_shardable(offload, two, cpu)
    with pytest.raises(ConfigValueError, match=r"run\.cpu_offload .* one process unsharded"):
        check_shardable(offload, Dist(), cuda)


def test_a_model_object_given_to_the_run_is_not_sharded():
    given = TrainConfig.model_validate({"model": {"name": "object:abc"}})
    check_shardable(given, Dist(), torch.device("cpu"))  # one process, unsharded: trains it
    with pytest.raises(ConfigValueError, match=r"run\.shard: a model object given"):
        check_shardable(given, Dist(sharded=True), torch.device("cpu"))


def test_a_positional_optimizer_state_loads_by_parameter_name():
    """An older checkpoint's optimizer state (by position) restores the same moments."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)  # positions count trained parameters only
    trained = [p for p in model.parameters() if p.requires_grad]
    first = torch.optim.AdamW(trained, lr=0.1)
    model(torch.randn(5, 3)).square().sum().backward()
    first.step()
    model.zero_grad(set_to_none=True)  # as a resumed run's model: no gradient yet
    fresh = torch.optim.AdamW(trained, lr=0.1)
    load_positional_optimizer_state(model, fresh, first.state_dict(), Dist())
    want, got = optimizer_state(model, first, Dist()), optimizer_state(model, fresh, Dist())
    assert want["state"].keys() == got["state"].keys() == {"0.weight", "1.weight", "1.bias"}
    for name, moments in want["state"].items():
        for key, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(got["state"][name][key]))
