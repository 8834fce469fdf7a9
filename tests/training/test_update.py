"""The policy update: log-probs at the forking tokens alone give the same step as all of them."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from rldojo.config import load_config
from rldojo.training.batch import build_token_batch, completion_logits, selected_logits
from rldojo.training.update import PolicyUpdate
from rldojo.types import Rollout

pytestmark = pytest.mark.slow  # tiny-random forwards and backwards


def _rollout(prompt: list[int], completion: list[int], version: int = 0) -> Rollout:
    return Rollout(
        "t", "e", [], "", tuple(prompt), tuple(completion), (True,) * len(completion),
        tuple(-0.5 - 0.1 * i for i in range(len(completion))), policy_version=version,
    )  # fmt: skip


ROLLOUTS = [
    _rollout([5, 6, 7], [8, 9, 10, 11]),
    _rollout([5, 6, 7], [10, 11, 12]),
    _rollout([1, 2, 3, 4, 5], [3, 7, 7, 7, 9]),
    _rollout([1, 2, 3, 4, 5], [4, 4, 4, 4], version=1),  # stale: takes the PPO ratio
]


@pytest.mark.parametrize("share", [True, False])
def test_selected_logits_equal_the_full_logits_at_those_positions(tiny, share):
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    where = torch.zeros_like(batch.policy_mask)
    where[0, [0, 3]] = where[2, 4] = where[3, 1] = True
    full = completion_logits(model, batch, share_prefix=share)[where]  # [N, V]
    picked = selected_logits(model, batch, where, share_prefix=share)  # [N, V]
    assert picked.shape == (4, full.shape[-1])
    assert torch.allclose(picked, full, atol=1e-5)


def _step(model, selected_logits_on: bool, selected: torch.Tensor, batch) -> dict:
    cfg = load_config(None, [
        "model.autocast_bf16=false", "optim.micro_batch_size=2", "optim.grad_clip=1e9",
        "loss.kl_coef=0.1", "sampling.temperature=0.7",
        f"optim.selected_logits={str(selected_logits_on).lower()}",
    ])  # fmt: skip
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():  # the reference differs from the policy, so KL is not 0
        for p in ref.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    update = PolicyUpdate(model, ref, opt, cfg)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(-1, selected.shape[1])
    return update.optimize(batch, adv, selected, version=0)


def test_update_through_selected_logits_equals_the_full_update(tiny):
    base, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    selected = torch.zeros_like(batch.policy_mask)
    selected[0, 1] = selected[1, 2] = selected[3, 0] = selected[3, 3] = True  # rows 2: none
    start = {k: v.clone() for k, v in base.state_dict().items()}
    deltas, metrics = [], []
    for on in (False, True):
        model = copy.deepcopy(base)
        metrics.append(_step(model, on, selected, batch))
        deltas.append({k: v - start[k] for k, v in model.state_dict().items()})
    full, split = deltas
    assert any(full[k].abs().max() > 0 for k in full)  # the step moved the weights
    for k in full:
        assert torch.allclose(full[k], split[k], atol=1e-6), k
    for key in ("loss/policy", "loss/kl", "loss/ratio_mean", "loss/tokens"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-7), key
    assert metrics[1]["loss/kl"] > 0


def _sgd_update(model, batch, selected, *extra: str, lr: float = 1.0) -> dict:
    cfg = load_config(None, ["model.autocast_bf16=false", "optim.grad_clip=1e9",
                             "loss.tis_cap=2.0", *extra])  # fmt: skip
    update = PolicyUpdate(model, None, torch.optim.SGD(model.parameters(), lr=lr), cfg)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand(-1, selected.shape[1])
    return update.optimize(batch, adv, selected, version=0)


@pytest.mark.parametrize("split", ["true", "false"])
def test_an_unselected_token_moves_no_weight(tiny, split):
    """The last token of row 0 feeds no later position, so its id reaches the update only
    through its own log-prob: unselected, swapping it changes nothing, bit for bit;
    selected, it changes the step (the control)."""
    base, tok = tiny
    fresh = [dataclasses.replace(r, policy_version=0) for r in ROLLOUTS]
    swapped = [dataclasses.replace(fresh[0], completion_ids=(8, 9, 10, 99)), *fresh[1:]]
    deltas = {}
    for name, rollouts in (("a", fresh), ("b", swapped)):
        batch = build_token_batch(rollouts, tok.pad_token_id, group_ids=[0, 0, 1, 1])
        for last in (False, True):
            selected = batch.policy_mask.clone()
            selected[0, 3] = last  # row 0's last completion token
            model = copy.deepcopy(base)
            before = {k: v.clone() for k, v in model.state_dict().items()}
            _sgd_update(model, batch, selected, f"optim.selected_logits={split}")
            deltas[name, last] = {k: v - before[k] for k, v in model.state_dict().items()}
    assert any(d.abs().max() > 0 for d in deltas["a", False].values())  # a real update
    assert all(
        torch.equal(deltas["a", False][k], deltas["b", False][k]) for k in deltas["a", False]
    )
    assert any(
        not torch.equal(deltas["a", True][k], deltas["b", True][k]) for k in deltas["a", True]
    )


def test_mini_batches_make_later_steps_off_policy_so_the_clip_binds(tiny):
    """One step per batch: the ratio is 1 and nothing is clipped. Two mini-batches: the
    second is trained after the first moved the policy, against the pre-update
    log-probs, so its ratio departs from 1 and the clip zeroes some gradients. (The
    random 2-layer model's gradients are ~1e-3, hence the large SGD step.)"""
    base, tok = tiny
    fresh = [dataclasses.replace(r, policy_version=0) for r in ROLLOUTS]
    batch = build_token_batch(fresh, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    selected = batch.policy_mask.clone()
    one = _sgd_update(copy.deepcopy(base), batch, selected, "optim.mini_batches=1", lr=1000.0)
    assert one["optim/steps"] == 1
    assert one["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6) and one["loss/clip_frac"] == 0
    two = _sgd_update(copy.deepcopy(base), batch, selected, "optim.mini_batches=2", lr=1000.0)
    assert two["optim/steps"] == 2
    assert two["loss/clip_frac"] > 0
    assert two["loss/ratio_mean"] != pytest.approx(1.0, abs=1e-3)
    epochs = _sgd_update(copy.deepcopy(base), batch, selected, "optim.epochs=2", lr=1000.0)
    assert epochs["optim/steps"] == 2 and epochs["loss/clip_frac"] > 0  # pass 2 is stale


def test_a_nan_gradient_skips_that_optimizer_step_only(tiny, monkeypatch):
    base, tok = tiny
    model = copy.deepcopy(base)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    original, calls = PolicyUpdate._microbatch_backward, []

    def poisoned(self, *args, **kwargs):  # the first mini-batch's gradient is NaN
        out = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            next(p for p in self.model.parameters() if p.grad is not None).grad.fill_(float("nan"))
        return out

    monkeypatch.setattr(PolicyUpdate, "_microbatch_backward", poisoned)
    m = _sgd_update(model, batch, batch.policy_mask.clone(), "optim.mini_batches=2", lr=0.1)
    assert m["optim/steps"] == 2 and m["optim/nonfinite_skipped"] == 1
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, start[k])]
    assert moved  # the second mini-batch's step was taken
