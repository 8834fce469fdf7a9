"""Tests for rldojo.training.losses: each function against a hand computation or a reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rldojo.training.losses import (
    group_advantages,
    high_entropy_mask,
    high_entropy_threshold,
    logprobs_and_entropy,
    loss_normaliser,
    policy_loss,
    token_entropy,
)
from rldojo.training.step_metrics import entropy_stats

# ------------------------------------------------------------------------ entropy


def test_token_entropy_uniform_peaked_and_masked_vocab() -> None:
    logits = torch.zeros(2, 3, 8)  # uniform -> log V
    assert torch.allclose(token_entropy(logits), torch.full((2, 3), math.log(8)))
    peaked = torch.tensor([[1000.0, 0.0, 0.0]])  # one-hot -> 0
    assert token_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    with_inf = torch.tensor([[0.0, 0.0, -math.inf, -math.inf]])  # two live tokens -> log 2
    assert token_entropy(with_inf).item() == pytest.approx(math.log(2), abs=1e-6)


def test_token_entropy_matches_definition_with_temperature_and_bf16() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 11, generator=g) * 3
    for temp in (1.0, 0.6, 1.7):
        p = torch.softmax(logits.double() / temp, dim=-1)
        expected = -(p * p.log()).sum(-1)
        got = token_entropy(logits, temperature=temp)
        assert got.dtype == torch.float32
        assert torch.allclose(got.double(), expected, atol=1e-5)
    bf16 = logits.bfloat16()
    got = token_entropy(bf16)
    assert got.dtype == torch.float32
    assert torch.allclose(got, token_entropy(bf16.float()))
    with pytest.raises(ValueError):
        token_entropy(logits, temperature=0.0)


def _direct(logits: torch.Tensor, ids: torch.Tensor, temp: float):
    logp_all = torch.log_softmax(logits.float() / temp, dim=-1)
    logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 7, 1024])
@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_logprobs_and_entropy_matches_direct(dtype, chunk_size, temp) -> None:
    g = torch.Generator().manual_seed(1)
    m, t, v = 3, 5, 13  # 15 rows: chunk 7 does not divide them
    base = (torch.randn(m, t, v, generator=g) * 2).to(dtype)
    ids = torch.randint(0, v, (m, t), generator=g)
    weights = torch.randn(m, t, generator=g)

    logits = base.clone().requires_grad_(True)
    logp, entropy = logprobs_and_entropy(logits, ids, temperature=temp, chunk_size=chunk_size)
    (logp * weights).sum().backward()

    ref_logits = base.clone().requires_grad_(True)
    ref_logp, ref_entropy = _direct(ref_logits, ids, temp)
    (ref_logp * weights).sum().backward()

    assert logp.dtype == entropy.dtype == torch.float32
    assert logp.shape == entropy.shape == (m, t)
    assert torch.allclose(logp, ref_logp.detach(), atol=1e-5)
    assert torch.allclose(entropy, ref_entropy.detach(), atol=1e-5)
    assert logits.grad is not None and ref_logits.grad is not None
    assert logits.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(logits.grad.float(), ref_logits.grad.float(), atol=tol)


@pytest.mark.slow
def test_logprobs_gradcheck_and_entropy_detached() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 5, (2, 3), generator=g)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return logprobs_and_entropy(x, ids, temperature=0.8, chunk_size=4)[0]

    assert torch.autograd.gradcheck(fn, (logits,))
    logp, entropy = logprobs_and_entropy(logits, ids)
    assert logp.requires_grad
    assert not entropy.requires_grad
    assert entropy.grad_fn is None


def test_logprobs_and_entropy_saves_no_fp32_copy_and_takes_views() -> None:
    g = torch.Generator().manual_seed(3)
    full = torch.randn(2, 9, 50, generator=g).bfloat16().requires_grad_(True)
    logits = full[:, :-1]  # shifted, non-contiguous view, as a trainer would pass
    ids = torch.randint(0, 50, (2, 8), generator=g)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = logprobs_and_entropy(logits, ids, chunk_size=5)
    # only the bf16 logits and the ids are kept for backward, not fp32 softmaxes
    assert sum(saved) <= logits.numel() * 2 + ids.numel() * 8
    logp.sum().backward()
    ref = full.detach().clone().requires_grad_(True)
    _direct(ref[:, :-1], ids, 1.0)[0].sum().backward()
    assert full.grad is not None and ref.grad is not None
    assert torch.allclose(full.grad.float(), ref.grad.float(), atol=2e-2)
    assert (full.grad[:, -1] == 0).all()


def test_logprobs_and_entropy_bad_args() -> None:
    logits, ids = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError):
        logprobs_and_entropy(logits, ids, chunk_size=0)
    with pytest.raises(ValueError):
        logprobs_and_entropy(logits, ids, temperature=-1.0)
    with pytest.raises(ValueError):
        logprobs_and_entropy(logits, ids[:, :2])


# ----------------------------------------------------------------- forking tokens


def _reference_block(ent: list[float], msk: list[bool], rho: float) -> list[bool]:
    values = sorted((e for e, m in zip(ent, msk, strict=True) if m), reverse=True)
    if not values:
        return [False] * len(ent)
    k = min(len(values), max(1, math.ceil(rho * len(values) - 1e-9)))
    threshold = values[k - 1]
    return [m and e >= threshold for e, m in zip(ent, msk, strict=True)]


def _reference_mask(ent, msk, rho, scope, mb=None) -> list[list[bool]]:
    """Pure-Python forking-token rule on nested lists."""
    rows = len(ent)
    if scope == "sequence":
        return [_reference_block(ent[i], msk[i], rho) for i in range(rows)]
    size = rows if scope == "batch" else mb
    out: list[list[bool]] = []
    for start in range(0, rows, size):
        block_e, block_m = ent[start : start + size], msk[start : start + size]
        flat_e = [e for row in block_e for e in row]
        flat_m = [m for row in block_m for m in row]
        flat = _reference_block(flat_e, flat_m, rho)
        width = len(ent[0])
        out += [flat[j : j + width] for j in range(0, len(flat), width)]
    return out


def _random_batch(seed: int, b: int = 7, t: int = 9):
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(b, t, generator=g) * 3
    if seed % 2:  # quantised entropies: lots of ties
        entropy = (entropy * 2).round() / 2
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[seed % b] = False  # an empty row (padding only)
    # Non-policy tokens get the highest entropies of all: they must never be picked.
    entropy = torch.where(mask, entropy, 100.0 + torch.rand(b, t, generator=g))
    return entropy, mask


@pytest.mark.parametrize("scope,mb", [("batch", None), ("sequence", None), ("microbatch", 3)])
def test_high_entropy_mask_matches_reference(scope, mb) -> None:
    for seed in range(40):
        entropy, mask = _random_batch(seed)
        for rho in (0.05, 0.2, 0.3, 0.5, 0.77, 1.0):
            got = high_entropy_mask(entropy, mask, rho, scope=scope, microbatch_size=mb)
            expected = _reference_mask(entropy.tolist(), mask.tolist(), rho, scope, mb)
            assert got.dtype == torch.bool
            assert got.tolist() == expected, (seed, rho)
            assert not (got & ~mask).any()


def test_high_entropy_mask_microbatch_differs_from_batch() -> None:
    entropy = torch.tensor([[5.0, 4.0], [1.0, 0.5]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    batch = high_entropy_mask(entropy, mask, 0.5)
    assert batch.tolist() == [[True, True], [False, False]]
    micro = high_entropy_mask(entropy, mask, 0.5, scope="microbatch", microbatch_size=1)
    assert micro.tolist() == [[True, False], [True, False]]
    assert micro.tolist() == high_entropy_mask(entropy, mask, 0.5, scope="sequence").tolist()


def test_high_entropy_mask_ties() -> None:
    mask = torch.ones(1, 5, dtype=torch.bool)
    equal = torch.full((1, 5), 2.0)
    assert high_entropy_mask(equal, mask, 0.2).all()  # all tied: keep all
    straddle = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0]])  # k = 2, threshold 3 ties three ways
    assert high_entropy_mask(straddle, mask, 0.4).tolist() == [[True, True, True, True, False]]
    assert high_entropy_threshold(straddle, mask, 0.4) == 3.0


def test_high_entropy_mask_k_uses_guarded_ceil() -> None:
    # 0.3 * 10 = 3.0000000000000004 in floats; a naive ceil would keep 4 tokens.
    entropy = torch.arange(10, dtype=torch.float32).unsqueeze(0)
    mask = torch.ones(1, 10, dtype=torch.bool)
    for scope in ("batch", "sequence"):
        got = high_entropy_mask(entropy, mask, 0.3, scope=scope)  # type: ignore[arg-type]
        assert got.sum().item() == 3
        assert got[0, 7:].all()
    assert high_entropy_mask(entropy, mask, 0.01).sum().item() == 1  # k is at least 1


def test_high_entropy_mask_rho_one_and_empty() -> None:
    entropy, mask = _random_batch(3)
    for scope in ("batch", "sequence", "microbatch"):
        got = high_entropy_mask(entropy, mask, 1.0, scope=scope, microbatch_size=2)  # type: ignore[arg-type]
        assert torch.equal(got, mask)
    empty = torch.zeros_like(mask)
    for scope in ("batch", "sequence", "microbatch"):
        got = high_entropy_mask(entropy, empty, 0.2, scope=scope, microbatch_size=2)  # type: ignore[arg-type]
        assert not got.any()
    assert high_entropy_threshold(entropy, empty, 0.2) is None


def test_high_entropy_threshold_is_kth_largest() -> None:
    entropy = torch.tensor([[0.1, 9.0, 0.7], [0.4, 0.9, 0.2]])
    mask = torch.tensor([[True, False, True], [True, True, True]])
    # masked values sorted: 0.9, 0.7, 0.4, 0.2, 0.1; rho 0.5 -> k = 3 -> 0.4
    assert high_entropy_threshold(entropy, mask, 0.5) == pytest.approx(0.4)


def test_high_entropy_mask_bad_args() -> None:
    entropy, mask = torch.rand(2, 3), torch.ones(2, 3, dtype=torch.bool)
    for rho in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            high_entropy_mask(entropy, mask, rho)
    with pytest.raises(ValueError):
        high_entropy_mask(entropy, mask, 0.2, scope="global")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        high_entropy_mask(entropy, mask, 0.2, scope="microbatch")
    with pytest.raises(ValueError):
        high_entropy_mask(entropy, mask[:, :2], 0.2)
    with pytest.raises(ValueError):
        high_entropy_threshold(entropy, mask, 0.0)


# ------------------------------------------------------------------- normalisers


def test_loss_normaliser_counts() -> None:
    policy = torch.tensor([[True, True, True, False], [True, True, False, False]])
    selected = torch.tensor([[True, False, False, False], [False, True, False, False]])
    assert loss_normaliser(selected, policy, "selected") == 2.0
    assert loss_normaliser(selected, policy, "all") == 5.0
    assert loss_normaliser(torch.zeros_like(policy), torch.zeros_like(policy), "all") == 1.0
    with pytest.raises(ValueError):
        loss_normaliser(selected, policy, "tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        loss_normaliser(selected[:, :2], policy, "all")


@pytest.mark.parametrize("normaliser", ["selected", "all"])
def test_normalisers_loss_value_and_gradient(normaliser) -> None:
    policy = torch.tensor([[True, True, True, False], [True, True, True, True]])
    selected = torch.tensor([[False, True, False, False], [True, False, False, True]])
    adv = torch.tensor([2.0, -0.5])
    old = torch.full((2, 4), -1.0)
    logprobs = old.clone().requires_grad_(True)  # ratio 1: loss per token is -A
    denom = loss_normaliser(selected, policy, normaliser)
    loss, metrics = policy_loss(logprobs, old, adv, selected, num_tokens=denom)
    # ratio 1, selected tokens: one with A=2, two with A=-0.5 -> sum of -A = -2 + 0.5 + 0.5
    d = 3.0 if normaliser == "selected" else 7.0  # selected tokens vs all policy tokens
    assert loss.item() == pytest.approx(-1.0 / d)
    loss.backward()
    grad = logprobs.grad
    assert grad is not None
    assert (grad[~selected] == 0).all()
    assert (grad[selected] != 0).all()
    assert grad[0, 1].item() == pytest.approx(-2.0 / d)  # d(-r·A)/dlp = -r·A, r = 1
    assert grad[1, 0].item() == pytest.approx(0.5 / d)
    assert metrics["tokens"] == 3.0


# -------------------------------------------------------------------- advantages


def test_group_advantages_hand_values() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups, eps=0.0)
    # group 0: mean .5, std .5 -> ±1; group 1: mean 2, std 1 -> ±1
    assert adv.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    raw = group_advantages(rewards, groups, scale_by_std=False)
    assert raw.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5, 1.0, -1.0])
    eps = group_advantages(rewards, groups, eps=0.5)
    assert eps[0].item() == pytest.approx(0.5 / 1.0)
    assert adv.dtype == torch.float32


def test_group_advantages_invalid_single_and_flat_groups() -> None:
    rewards = torch.tensor([1.0, math.nan, 0.0, 5.0, 2.0, 2.0, 7.0, 0.1, 0.1, 0.1])
    groups = torch.tensor([0, 0, 0, 1, 2, 2, 3, 4, 4, 4])
    valid = torch.tensor([True, False, True, True, True, True, True, True, True, True])
    adv = group_advantages(rewards, groups, valid, eps=0.0)
    assert not adv.isnan().any()
    # group 0: NaN member invalid -> zero, the others see mean .5 std .5
    assert adv[:3].tolist() == pytest.approx([1.0, 0.0, -1.0])
    assert adv[3:].tolist() == [0.0] * 7  # single member; zero variance (exactly, even 0.1s)
    # a group whose only other member is invalid has a single valid member: zero
    valid2 = torch.tensor([True, True, False, True, True, True, True, True, True, True])
    assert group_advantages(rewards, groups, valid2)[:3].tolist() == [0.0, 0.0, 0.0]


def test_group_advantages_noncontiguous_ids_match_loop() -> None:
    g = torch.Generator().manual_seed(4)
    ids = torch.tensor([7, -3, 7, 100, -3, 7, 100, 42, -3, 100, 7, 42])
    rewards = torch.randn(12, generator=g)
    valid = torch.rand(12, generator=g) < 0.8
    for scale in (True, False):
        adv = group_advantages(rewards, ids, valid, scale_by_std=scale)
        for gid in ids.unique().tolist():
            members = [i for i in range(12) if ids[i] == gid and valid[i]]
            vals = np.array([rewards[i].item() for i in members])
            for i in range(12):
                if ids[i] != gid:
                    continue
                if not valid[i] or len(members) < 2:
                    assert adv[i].item() == 0.0
                    continue
                want = rewards[i].item() - vals.mean()
                if scale:
                    want /= vals.std() + 1e-6
                assert adv[i].item() == pytest.approx(want, abs=1e-5)


def test_group_advantages_bad_shapes() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


# ---------------------------------------------------------------------------- loss

RATIOS = [1.1, 0.5, 1.5]


def _per_token_setup():
    """Six tokens: ratios 1.1 (inside), 0.5 (below 0.8), 1.5 (above 1.28), for A = ±1."""
    old = torch.full((2, 3), -2.0)
    logprobs = (old + torch.tensor(RATIOS).log()).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    return logprobs, old, adv


def _per_token_losses(logprobs, old, adv, **kw) -> tuple[list[list[float]], list[list[float]]]:
    """Loss and gradient of each token alone (one-hot mask, num_tokens=1)."""
    losses, grads = [[0.0] * 3 for _ in range(2)], [[0.0] * 3 for _ in range(2)]
    for i in range(2):
        for j in range(3):
            mask = torch.zeros(2, 3, dtype=torch.bool)
            mask[i, j] = True
            lp = logprobs.detach().clone().requires_grad_(True)
            loss, _ = policy_loss(lp, old, adv, mask, num_tokens=1.0, **kw)
            loss.backward()
            assert lp.grad is not None
            losses[i][j], grads[i][j] = loss.item(), lp.grad[i, j].item()
    return losses, grads


def test_policy_loss_clip_higher_per_token() -> None:
    logprobs, old, adv = _per_token_setup()
    losses, grads = _per_token_losses(logprobs, old, adv)
    # A=+1: -min(r, clip(r)) -> -1.1, -0.5, -1.28 (clipped above 1.28: no gradient)
    # A=-1: -min(-r, -clip(r)) -> 1.1, 0.8 (clipped below 0.8: no gradient), 1.5
    assert losses == [pytest.approx([-1.1, -0.5, -1.28]), pytest.approx([1.1, 0.8, 1.5])]
    # d(-r·A)/dlp = -r·A where unclipped
    assert grads == [pytest.approx([-1.1, -0.5, 0.0]), pytest.approx([1.1, 0.0, 1.5])]
    _, metrics = policy_loss(logprobs, old, adv, torch.ones(2, 3, dtype=torch.bool))
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["clip_frac"] == pytest.approx(2 / 6)
    assert metrics["ratio_mean"] == pytest.approx(sum(RATIOS) / 3)
    want_kl = 0.5 * sum(math.log(r) ** 2 for r in RATIOS) / 3
    assert metrics["approx_kl"] == pytest.approx(want_kl)
    assert metrics["tokens"] == 6.0
    assert "dual_clip_frac" not in metrics and "kl" not in metrics


def test_policy_loss_symmetric_eps_and_token_advantages() -> None:
    logprobs, old, adv = _per_token_setup()
    token_adv = adv.unsqueeze(1).expand(2, 3).clone()
    mask = torch.ones(2, 3, dtype=torch.bool)
    a, _ = policy_loss(logprobs, old, adv, mask)
    b, _ = policy_loss(logprobs, old, token_adv, mask)
    assert a.item() == pytest.approx(b.item())
    losses, _ = _per_token_losses(logprobs, old, adv, eps_high=0.2)
    assert losses[0][2] == pytest.approx(-1.2)


def test_policy_loss_dual_clip() -> None:
    old = torch.full((2, 3), -3.0)
    logprobs = old + torch.tensor([2.0, 5.0, 0.5]).log()
    adv = torch.tensor([1.0, -1.0])
    losses, grads = _per_token_losses(logprobs, old, adv, dual_clip=3.0)
    # A=-1: ratio 2 -> 2 (grad), ratio 5 -> capped at 3·|A| = 3 (no grad), ratio .5 -> .8
    assert losses[1] == pytest.approx([2.0, 3.0, 0.8])
    assert grads[1] == pytest.approx([2.0, 0.0, 0.0])
    assert losses[0] == pytest.approx([-1.28, -1.28, -0.5])  # A > 0 untouched
    no_dual, _ = _per_token_losses(logprobs, old, adv)
    assert no_dual[1][1] == pytest.approx(5.0)
    mask = torch.ones(2, 3, dtype=torch.bool)
    _, metrics = policy_loss(logprobs, old, adv, mask, dual_clip=3.0)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 6)
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError):
            policy_loss(logprobs, old, adv, mask, dual_clip=bad)


def test_policy_loss_k3_kl() -> None:
    old = torch.full((1, 3), -1.0)
    logprobs = old.clone().requires_grad_(True)
    ref = torch.tensor([[-1.5, -1.0, -0.2]])
    mask = torch.tensor([[True, True, True]])
    loss, metrics = policy_loss(logprobs, old, torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.1)
    d = (ref - old)[0].tolist()
    kl = [math.exp(x) - x - 1 for x in d]
    assert metrics["kl"] == pytest.approx(sum(kl) / 3)
    assert loss.item() == pytest.approx(0.1 * sum(kl) / 3)
    assert kl[1] == 0.0 and min(kl) >= 0.0
    loss.backward()
    assert logprobs.grad is not None
    # d/dlp of e^(ref-lp) - (ref-lp) - 1 = 1 - e^(ref-lp)
    want = [0.1 * (1 - math.exp(x)) / 3 for x in d]
    assert logprobs.grad[0].tolist() == pytest.approx(want)


def test_policy_loss_global_num_tokens_sums_over_microbatches() -> None:
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(4, 6, generator=g) * 3
    logprobs = (old + torch.randn(4, 6, generator=g) * 0.3).requires_grad_(True)
    adv = torch.randn(4, generator=g)
    mask = torch.rand(4, 6, generator=g) < 0.7
    full, _ = policy_loss(logprobs, old, adv, mask)
    (full_grad,) = torch.autograd.grad(full, logprobs)
    n = float(mask.sum())
    halves = (slice(0, 1), slice(1, 4))  # uneven micro-batches
    parts = [policy_loss(logprobs[s], old[s], adv[s], mask[s], num_tokens=n)[0] for s in halves]
    total = parts[0] + parts[1]
    (acc_grad,) = torch.autograd.grad(total, logprobs)
    assert total.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(acc_grad, full_grad, atol=1e-7)
    # without the global count each micro-batch is its own mean: not the batch mean
    local = [policy_loss(logprobs[s], old[s], adv[s], mask[s])[0] for s in halves]
    assert (local[0] + local[1]).item() != pytest.approx(full.item(), abs=1e-6)


def test_policy_loss_ignores_padding_and_empty_mask() -> None:
    old = torch.tensor([[-1.0, -1.0, math.nan]])
    logprobs = torch.tensor([[-0.9, -1.2, math.inf]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    loss, metrics = policy_loss(logprobs, old, torch.tensor([1.0]), mask)
    assert math.isfinite(loss.item())
    loss.backward()
    assert logprobs.grad is not None and logprobs.grad[0, 2].item() == 0.0
    empty = torch.zeros(1, 3, dtype=torch.bool)
    loss, metrics = policy_loss(logprobs, old, torch.tensor([1.0]), empty)
    assert loss.item() == 0.0
    assert metrics["tokens"] == 0.0
    assert all(math.isfinite(v) for v in metrics.values())
    with pytest.raises(ValueError):
        policy_loss(logprobs, old, torch.tensor([1.0]), mask, num_tokens=0.0)
    with pytest.raises(ValueError):
        policy_loss(logprobs, old, torch.tensor([1.0]), mask, eps_low=1.0)


# ------------------------------------------------------------------------ logging


def test_entropy_stats_matches_numpy() -> None:
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        entropy = torch.rand(6, 17, generator=g) ** 3 * 2
        mask = torch.rand(6, 17, generator=g) < 0.5
        entropy = torch.where(mask, entropy, 50.0)
        stats = entropy_stats(entropy, mask)
        values = entropy[mask].double().numpy()
        assert stats["count"] == float(values.size)
        for name, q in (("p50", 50), ("p80", 80), ("p95", 95)):
            assert stats[name] == pytest.approx(np.percentile(values, q), abs=1e-6)
        assert stats["mean"] == pytest.approx(values.mean(), abs=1e-6)
        assert stats["frac_below_0.01"] == pytest.approx((values < 0.01).mean())


def test_entropy_stats_single_and_empty() -> None:
    one = entropy_stats(torch.tensor([[0.005, 9.0]]), torch.tensor([[True, False]]))
    assert one["p50"] == one["p95"] == pytest.approx(0.005)
    assert one["frac_below_0.01"] == 1.0 and one["count"] == 1.0
    empty = entropy_stats(torch.rand(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert empty == {
        "p50": 0.0,
        "p80": 0.0,
        "p95": 0.0,
        "frac_below_0.01": 0.0,
        "mean": 0.0,
        "count": 0.0,
    }


def test_is_weights_scale_each_token_policy_term():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logprobs.detach()
    adv = torch.tensor([1.0])
    mask = torch.tensor([[True, True, True]])
    weights = torch.tensor([[0.5, 2.0, 0.0]])
    loss, _ = policy_loss(logprobs, old, adv, mask, is_weights=weights)
    loss.backward()
    # d/dlp of -(w * ratio * A) / 3 at ratio 1 is -w * A / 3 per token.
    assert torch.allclose(logprobs.grad, -weights / 3)


def test_token_advantages_add_per_token_rewards():
    from rldojo.training.update import token_advantages
    from rldojo.types import Score

    adv = torch.tensor([0.5, -1.0])
    scores = [Score(value=1.0, token_rewards=(0.0, -0.3)), Score(value=0.0)]
    out = token_advantages(adv, scores, 3)
    assert torch.allclose(out, torch.tensor([[0.5, 0.2, 0.5], [-1.0, -1.0, -1.0]]))


def test_selection_keys_pick_the_highest_the_lowest_or_a_random_share():
    from rldojo.training.losses import selection_key

    entropy = torch.tensor([[0.1, 2.0, 0.5, 3.0, 0.2]])
    mask = torch.ones_like(entropy, dtype=torch.bool)
    top = high_entropy_mask(selection_key(entropy, "highest"), mask, 0.4)
    low = high_entropy_mask(selection_key(entropy, "lowest"), mask, 0.4)
    assert top.tolist() == [[False, True, False, True, False]]
    assert low.tolist() == [[True, False, False, False, True]]
    picks = [
        high_entropy_mask(
            selection_key(entropy, "random", torch.Generator().manual_seed(s)), mask, 0.4
        )
        for s in range(20)
    ]
    assert all(int(p.sum()) == 2 for p in picks)  # always the rho share
    assert len({tuple(p[0].tolist()) for p in picks}) > 3  # and not always the same
    with pytest.raises(ValueError, match="unknown selection"):
        selection_key(entropy, "middle")


def test_logged_threshold_follows_the_scope():
    from rldojo.training.step_metrics import mask_threshold

    entropy = torch.tensor([[0.1, 2.0, 0.5], [3.0, 0.2, 1.0]])
    mask = torch.ones_like(entropy, dtype=torch.bool)
    batch = high_entropy_mask(entropy, mask, 0.5, "batch")
    assert mask_threshold(entropy, batch, "batch", 1) == high_entropy_threshold(entropy, mask, 0.5)
    rows = high_entropy_mask(entropy, mask, 0.5, "sequence")  # per row: top 2 of 3
    assert mask_threshold(entropy, rows, "sequence", 1) == pytest.approx((0.5 + 1.0) / 2)
    none = torch.zeros_like(mask)
    assert mask_threshold(entropy, none, "batch", 1) is None
