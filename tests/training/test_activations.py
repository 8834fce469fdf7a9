"""Activation checkpointing: exact gradients with and without the shared-prompt KV path,
fewer tensors kept for the backward pass, and nothing left on the model afterwards."""

from __future__ import annotations

import pytest
import torch

from rldojo.training.activations import checkpointed_layers, decoder_layers
from rldojo.training.batch import build_token_batch, completion_logits, selected_logits
from rldojo.types import Rollout

pytestmark = pytest.mark.slow  # tiny-random forwards and backwards


def _rollout(prompt: list[int], completion: list[int]) -> Rollout:
    n = len(completion)
    return Rollout("t", "e", [], "", tuple(prompt), tuple(completion), (True,) * n, (0.0,) * n)


# Two groups of two rows (each group shares its prompt), prompts of different lengths.
ROLLOUTS = [
    _rollout([5, 6, 7, 8], [9, 10, 11]),
    _rollout([5, 6, 7, 8], [12, 13]),
    _rollout([1, 2, 3, 4, 5, 6], [7, 8, 9, 10]),
    _rollout([1, 2, 3, 4, 5, 6], [11]),
]


def _grads(model, batch, *, share: bool, recompute: bool, split: bool = False):
    """The loss's gradients, and the bytes of activations autograd saved for the backward
    pass (weights and the vocabulary-wide logits left out: the layers' share is asked)."""
    model.zero_grad(set_to_none=True)
    saved: list[int] = []
    weights = {p.data_ptr() for p in model.parameters()}
    vocab = model.config.vocab_size

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights and (t.dim() == 0 or t.shape[-1] != vocab):
            saved.append(t.numel() * t.element_size())
        return t

    mask = batch.policy_mask  # [M, T]
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, checkpointed_layers(model, recompute):
        if split:
            logits = selected_logits(model, batch, mask, share_prefix=share)  # [N, V]
            picked = logits.log_softmax(-1).gather(-1, batch.completion_ids[mask][:, None])
        else:
            logits = completion_logits(model, batch, share_prefix=share)  # [M, T, V]
            lp = logits.log_softmax(-1).gather(-1, batch.completion_ids[..., None])[..., 0]
            picked = lp[mask]
    loss = -picked.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, sum(saved)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("split", [True, False])
def test_checkpointed_gradients_equal_plain_ones(tiny, share, split):
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    loss, plain, saved_plain = _grads(model, batch, share=share, recompute=False, split=split)
    loss_ck, ckpt, saved_ckpt = _grads(model, batch, share=share, recompute=True, split=split)
    assert loss_ck == pytest.approx(loss, rel=1e-6)
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for name, g in plain.items():
        assert torch.allclose(g, ckpt[name], atol=1e-6, rtol=1e-5), name
    # Only each layer's input is kept, not its internals: far fewer saved bytes.
    assert saved_ckpt < 0.5 * saved_plain, (saved_ckpt, saved_plain)


def test_shared_prompt_path_is_really_taken_under_checkpointing(tiny):
    """The prompt runs once per group: the decoder sees 2 prompt rows, not 4."""
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    first_layer = decoder_layers(model)[0]
    rows: list[int] = []
    hook = first_layer.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    try:
        _grads(model, batch, share=True, recompute=True)
    finally:
        hook.remove()
    # forward: prompt pass (2 unique prompts), tail pass (4 rows); the backward replays
    # run the layer's forward, not the module call, so no hook fires for them.
    assert rows == [2, 4]


def test_layers_are_restored_and_no_grad_forwards_pass_through(tiny):
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    with checkpointed_layers(model):
        assert all("forward" in vars(layer) for layer in decoder_layers(model))
        with torch.no_grad():
            inside = completion_logits(model, batch)
    assert not any("forward" in vars(layer) for layer in decoder_layers(model))
    with torch.no_grad():
        outside = completion_logits(model, batch)
    assert torch.equal(inside, outside)


def test_a_model_without_decoder_layers_is_refused():
    refused = pytest.raises(ValueError, match="no transformers decoder layers")
    with refused, checkpointed_layers(torch.nn.Linear(2, 2)):
        pass


@pytest.mark.parametrize("autocast", ["false", "true"])
def test_policy_update_with_checkpointing_takes_the_same_step(tiny, autocast, monkeypatch):
    """`optim.activation_checkpointing` through `PolicyUpdate`: the layers really run
    checkpointed (each layer twice per micro-batch: prompt and rows) and an SGD step
    moves the weights as the plain update does."""
    import copy

    from rldojo.config import load_config
    from rldojo.training import activations
    from rldojo.training.update import PolicyUpdate

    base, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    calls = []
    real = activations.checkpoint
    monkeypatch.setattr(activations, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    start = {k: v.clone() for k, v in base.state_dict().items()}
    deltas = []
    for on in ("false", "true"):
        model = copy.deepcopy(base)
        cfg = load_config(None, [f"model.autocast_bf16={autocast}", "optim.grad_clip=1e9",
                                 f"optim.activation_checkpointing={on}",
                                 "optim.micro_batch_size=4"])  # fmt: skip
        update = PolicyUpdate(model, None, torch.optim.SGD(model.parameters(), lr=1.0), cfg)
        adv = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand(-1, batch.policy_mask.shape[1])
        update.optimize(batch, adv, batch.policy_mask, version=0)
        deltas.append({k: v - start[k] for k, v in model.state_dict().items()})
    assert len(calls) == 2 * len(decoder_layers(base))  # only when asked, prompt + rows
    plain, ckpt = deltas
    assert any(plain[k].abs().max() > 0 for k in plain)
    tol = 1e-6 if autocast == "false" else 1e-3  # bf16 casts: same values, other rounding
    for k in plain:
        assert torch.allclose(plain[k], ckpt[k], atol=tol), k


def _accumulated(model, batch, *, share: bool, recompute: bool) -> dict[str, torch.Tensor]:
    """Gradients of two backward passes accumulated in `.grad` (two micro-batches)."""
    model.zero_grad(set_to_none=True)
    for _ in range(2):
        with checkpointed_layers(model, recompute):
            logits = selected_logits(model, batch, batch.policy_mask, share_prefix=share)
        (-logits.log_softmax(-1)[:, 5].sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", [True, False])
def test_shared_prompt_gradients_accumulate_like_the_plain_path(tiny, recompute):
    """The prompt pass's weight gradients (added to `.grad` on their own path) sum to the
    plain path's, also into gradients already there, tied embeddings included."""
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    plain = _accumulated(model, batch, share=False, recompute=False)
    shared = _accumulated(model, batch, share=True, recompute=recompute)
    assert plain.keys() == shared.keys()
    for name, g in plain.items():
        assert g.abs().sum() > 0, name
        assert torch.allclose(g, shared[name], atol=1e-6, rtol=1e-5), name


def test_row_gradients_reach_grad_before_the_prompt_pass_is_replayed(tiny):
    """A weight used by the prompt pass and the rows' pass must not have its rows'
    gradient held until the prompt's arrives (a second set of gradients at the peak):
    every decoder weight's `.grad` is written before the backward replays the prompt
    pass (the checkpointed prompt layers, 2 rows, run again only then)."""
    model, tok = tiny
    batch = build_token_batch(ROLLOUTS, tok.pad_token_id, group_ids=[0, 0, 1, 1])
    model.zero_grad(set_to_none=True)
    events: list[object] = []
    names = {p: n for n, p in model.named_parameters()}
    layer_weights = {names[p] for layer in decoder_layers(model) for p in layer.parameters()}
    handles = [p.register_post_accumulate_grad_hook(lambda p: events.append(names[p]))
               for p in model.parameters()]  # fmt: skip
    mlp = decoder_layers(model)[0].mlp
    handles.append(mlp.register_forward_pre_hook(lambda m, a: events.append(a[0].shape[0])))
    try:
        with checkpointed_layers(model, True):
            logits = selected_logits(model, batch, batch.policy_mask, share_prefix=True)
        events.append("backward")
        (-logits.log_softmax(-1)[:, 5].sum()).backward()
    finally:
        for h in handles:
            h.remove()
    after = events[events.index("backward") + 1 :]
    assert after.count(2) == 1 and after.count(4) == 1  # each pass replayed once
    before_prompt = set(after[: after.index(2)])
    assert layer_weights <= before_prompt, sorted(layer_weights - before_prompt)[:3]
