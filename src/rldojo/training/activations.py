"""Activation checkpointing that keeps the shared-prompt KV path (`optim.activation_checkpointing`).

A training forward keeps every decoder layer's intermediate tensors for the backward pass;
for SmolLM2 at the quickstart's shape that is most of the step's peak memory above the
weights and optimizer state. Checkpointing keeps only each layer's input and recomputes
the layer during the backward pass: about one more forward per step, for a peak that no
longer grows with the layers' internals.

transformers' own gradient checkpointing (`model.gradient_checkpointing_enable()`) turns
the KV cache off in training (`use_cache=False`: a layer that writes the cache would
write it a second time when the backward pass replays it). rldojo's training forward
needs that cache: `train.batch` runs a group's prompt once and lets every row attend to
its keys and values. So this module checkpoints each decoder layer itself and makes the
replay idempotent: before the layer runs, the cache layer's state is noted; the replay
puts it back first, so the layer's `cache.update` returns exactly the keys and values of
the first run (the prompt's, then the prompt's plus the row's). The gradient still flows
through the one prompt pass: non-reentrant checkpointing records the graph as usual and
only drops the tensors it saves, so keys and values that leave a layer through the cache
are ordinary graph edges.

Layers are wrapped only inside `checkpointed_layers(model)` (per forward; nothing stays
on the model, so copies of it, the generation copy among them, are untouched) and only
while gradients are enabled: no-grad forwards (old log-probs, the KL reference, the
trainer's entropies) run as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's decoder layers (transformers' `GradientCheckpointingLayer`s), in order.
    Works through LoRA (peft) wrappers, which keep the base model's modules."""
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def _layer_index(layer: torch.nn.Module, position: int) -> int:
    """The index the layer's attention writes into the cache under (its position if the
    attention does not say)."""
    attention = getattr(layer, "self_attn", None)
    index = getattr(attention, "layer_idx", None)
    return position if index is None else int(index)


def _cache_of(kwargs: dict[str, Any]) -> Any:
    for key in ("cache", "past_key_values"):
        if kwargs.get(key) is not None:
            return kwargs[key]
    return None


def _snapshot(cache: Any, index: int) -> dict[str, Any] | None:
    """The cache layer's attributes before the layer runs (None: no such layer yet)."""
    layers = getattr(cache, "layers", None)
    if layers is None or index >= len(layers):
        return None
    return dict(vars(layers[index]))


def _restore(cache: Any, index: int, state: dict[str, Any] | None) -> None:
    """Put the cache layer back as `_snapshot` found it, so the replay's update matches."""
    layers = cache.layers
    if index >= len(layers):
        return  # not created yet: the layer's update creates it, as on the first run
    if state is None:
        layers[index].reset()  # created by the first run: start it empty again
    else:
        vars(layers[index]).update(state)


def _checkpointed_forward(layer: torch.nn.Module, index: int) -> Any:
    forward = layer.forward  # the class's forward, bound (no instance attribute yet)

    def run(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(hidden_states, *args, **kwargs)
        cache = _cache_of(kwargs)
        state = None if cache is None else _snapshot(cache, index)

        def body(h: torch.Tensor) -> Any:
            if cache is not None:
                _restore(cache, index, state)
            return forward(h, *args, **kwargs)

        return checkpoint(body, hidden_states, use_reentrant=False)

    return run


@contextmanager
def checkpointed_layers(model: Any, enabled: bool = True) -> Iterator[None]:
    """Within the block, each decoder layer of `model` runs checkpointed when gradients
    are on. `enabled=False` is a no-op (so call sites need no branch)."""
    if not enabled:
        yield
        return
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            f"{type(model).__name__}: no transformers decoder layers to checkpoint "
            "(optim.activation_checkpointing needs a transformers causal LM)"
        )
    for position, layer in enumerate(layers):
        layer.forward = _checkpointed_forward(layer, _layer_index(layer, position))
    try:
        yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)


def with_own_gradients(net: Any) -> Any:
    """`net`, callable as usual, whose trainable weights reach `.grad` on their own path.

    A weight used by two passes of one forward (the shared prompt's, then the rows')
    has one gradient slot in autograd: the rows' gradient waits in the engine's buffers
    until the prompt pass's arrives at the very end of the backward, so every weight's
    gradient is held twice (for SmolLM2, 513 MiB more at the peak of each micro-batch
    after the first). Called through this, the pass sees leaf aliases of the weights
    (same storage) whose gradients are added into the weights' `.grad` as soon as they
    are complete, and the rows' gradients are accumulated as soon as theirs are. The
    gradient is the same sum. Under `no_grad` it returns `net` itself."""
    if not torch.is_grad_enabled():
        return net
    aliases = {}
    for name, weight in net.named_parameters():  # tied weights appear once, and stay tied
        if weight.requires_grad:
            alias = weight.detach().requires_grad_()
            alias.register_post_accumulate_grad_hook(_adder(weight))
            aliases[name] = alias
    return lambda *args, **kwargs: functional_call(net, aliases, args, kwargs)


def _adder(weight: torch.Tensor) -> Any:
    def add(alias: torch.Tensor) -> None:
        grad, alias.grad = alias.grad, None
        if grad is None:  # nothing reached this alias
            return
        if weight.grad is None:
            weight.grad = grad
        else:
            weight.grad.add_(grad)

    return add
