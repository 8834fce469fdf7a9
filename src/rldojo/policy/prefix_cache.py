"""Cross-turn KV reuse for the transformers backend: a multi-turn episode's next prompt
is its previous prompt, the sampled turn and the environment's answer
(`rldojo.rollout.episodes` builds it from tokens), so the keys and values of everything
before the answer were computed by the previous `generate` call. Kept, they turn each
later turn's prefill from the whole conversation into its new tokens: on CPUs prefill is
most of a multi-turn episode's generation (`benchmarks/multiturn_generation.py`).

Lifetime: the entries of one `generate` call serve the next call only. `collect_rollouts`
asks for every live episode at each turn, so an entry the next call does not use belongs
to an episode that ended; it is dropped then, and memory holds one turn's conversations.
Any change of the weights (an optimizer step, a loaded state dict, `update_weights`)
changes `weights_fingerprint`, which empties the cache. Stored: each finished row's
keys and values over its real tokens (the prompt and the sampled tokens the model was
fed: all but the last), on the model's device in the generation dtype, up to `max_bytes`
per call (rows past it are not stored; they prefill in full next turn).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# A cached prefix shorter than this is not worth a separate prefill.
MIN_REUSED_TOKENS = 16


@dataclass
class Entry:
    """One conversation's KV: per layer `[H, L, D]` keys and values over its L tokens."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[-2])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def weights_fingerprint(model: torch.nn.Module, version: int) -> tuple[object, ...]:
    """Changes whenever a parameter of `model` changes: in-place updates bump a tensor's
    version counter (`Tensor._version`, what autograd checks), replacement changes its
    identity or storage; `version` is the policy's own count of `update_weights` calls."""
    return (version, *((id(p), p.data_ptr(), p._version) for p in model.parameters()))


class PrefixCache:
    """Token sequence -> its KV, for the next `generate` call (module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._fingerprint: tuple[object, ...] | None = None
        # token sequence -> (its KV, how many rows ended with it: each continues once)
        self._serving: dict[tuple[int, ...], tuple[Entry, int]] = {}  # the previous call's
        self._stored: dict[tuple[int, ...], tuple[Entry, int]] = {}  # this call's
        self._stored_bytes = 0
        self.reused_tokens = 0  # over the cache's life, for tests and benchmarks
        self.prompt_tokens = 0

    def begin(self, fingerprint: tuple[object, ...]) -> None:
        """A `generate` call starts: the last call's entries serve it (none if the weights
        changed since)."""
        self._serving = self._stored if fingerprint == self._fingerprint else {}
        self._fingerprint = fingerprint
        self._stored, self._stored_bytes = {}, 0

    def end(self) -> None:
        """The call is over: entries it did not use belong to ended episodes."""
        self._serving = {}

    def take(self, prompt: Sequence[int]) -> Entry | None:
        """The longest served entry whose tokens start `prompt` and leave at least one of
        its tokens to feed. Each row that stored it can take it once (greedy episodes
        that opened alike share it), then it is freed."""
        lengths = sorted({len(k) for k in self._serving}, reverse=True)
        for length in lengths:
            if MIN_REUSED_TOKENS <= length < len(prompt):
                key = tuple(prompt[:length])
                if key in self._serving:
                    entry, rows = self._serving[key]
                    if rows > 1:
                        self._serving[key] = (entry, rows - 1)
                    else:
                        del self._serving[key]
                    return entry
        return None

    def store(self, tokens: Sequence[int], entry: Entry) -> None:
        if entry.length != len(tokens):
            raise ValueError(
                f"prefix cache: {entry.length} cached positions for {len(tokens)} tokens"
            )
        key = tuple(tokens)
        if key in self._stored:  # the same conversation in another row
            kept, rows = self._stored[key]
            self._stored[key] = (kept, rows + 1)
        elif self._stored_bytes + entry.nbytes <= self.max_bytes:
            self._stored[key] = (entry, 1)
            self._stored_bytes += entry.nbytes


def store_rows(
    prefix: PrefixCache, cache: DynamicCache, mask: torch.Tensor, rows: dict[int, list[int]]
) -> None:
    """Store batch row i's keys and values (its real columns of `mask`, `[B, L]`) under
    `rows[i]`, the tokens they were computed from; nothing if the cache is not `joinable`."""
    if joinable(cache):
        layers = kv_layers(cache)
        for i, tokens in rows.items():
            prefix.store(tokens, row_entry(layers, i, mask[i].bool()))


def joinable(cache: DynamicCache) -> bool:
    """Only plain full-attention layers can be padded and concatenated (no sliding windows)."""
    return not getattr(cache, "offloading", False) and all(
        type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers
    )


class _KV(Protocol):
    """A cache layer's `[B, H, L, D]` keys and values, typed (transformers' may be None)."""

    keys: torch.Tensor
    values: torch.Tensor


def kv_layers(cache: DynamicCache) -> list[_KV]:
    """The layers of a `joinable` cache, whose keys and values are set."""
    return cast(list[_KV], cache.layers)


def row_entry(layers: Sequence[Any], row: int, real: torch.Tensor) -> Entry:
    """Copy batch row `row`'s keys and values at the columns where `real` is True."""
    columns = real.nonzero().squeeze(-1)  # [L]
    return Entry(
        [layer.keys[row].index_select(-2, columns) for layer in layers],  # [H, L, D] each
        [layer.values[row].index_select(-2, columns) for layer in layers],
    )


def cached_batch(entries: Sequence[Entry]) -> tuple[DynamicCache, torch.Tensor]:
    """The entries as one left-padded cache and its `[B, P]` attention mask."""
    width = max(e.length for e in entries)
    device = entries[0].keys[0].device
    cache = DynamicCache()
    for index in range(len(entries[0].keys)):
        keys = torch.stack([_left_pad(e.keys[index], width) for e in entries])  # [B, H, P, D]
        values = torch.stack([_left_pad(e.values[index], width) for e in entries])
        cache.update(keys, values, index)
    mask = torch.zeros(len(entries), width, dtype=torch.long, device=device)  # [B, P]
    for row, entry in enumerate(entries):
        mask[row, width - entry.length :] = 1
    return cache, mask


def _left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zeros before `x`'s `[H, L, D]` sequence axis up to `width`."""
    missing = width - x.shape[-2]
    return torch.nn.functional.pad(x, (0, 0, missing, 0)) if missing else x
