"""Cross-turn KV reuse for the transformers backend: a multi-turn episode's next prompt
is its previous prompt, the sampled turn and the environment's answer
(`rldojo.rollout.episodes` builds it from tokens), so the keys and values of everything
before the answer were computed when the previous turn was sampled. Kept, they turn each
later turn's prefill from the whole conversation into its new tokens: on CPUs prefill is
most of a multi-turn episode's generation (`benchmarks/multiturn_generation.py`).

Stored: each finished row's keys and values over its real tokens (the prompt and the
sampled tokens the model was fed: all but the last), on the model's device in the
generation dtype. Any change of the weights (an optimizer step, a loaded state dict,
`update_weights`) changes `weights_fingerprint`, which empties the cache: keys computed
by other weights would sample another policy.

Two lifetimes, for the two ways turns arrive:
- per call (`sample`, `TransformersPolicy.generate`): the entries of one call serve the
  next call only. `collect_rollouts` asks for every live episode at each turn, so an
  entry the next call does not use belongs to an episode that ended; it is dropped then,
  and memory holds one turn's conversations, up to `max_bytes` per call (rows past it are
  not stored; they prefill in full next turn).
- lasting (`lasting=True`: the decode engine's, `rldojo.policy.engine`): there are no
  calls, an episode's next turn arrives whenever its environment answers. An entry stays
  until a turn takes it; past `max_bytes` the least recently stored go first (an ended
  episode's entry is never taken, so it ages out).
"""

from __future__ import annotations

from collections import OrderedDict
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


Fingerprint = tuple[object, ...]
"""Identifies the weights keys and values were computed with (`weights_fingerprint`)."""

_Key = tuple[int, ...]


def weights_fingerprint(model: torch.nn.Module, version: int) -> Fingerprint:
    """Changes whenever a parameter of `model` changes: in-place updates bump a tensor's
    version counter (`Tensor._version`, what autograd checks), replacement changes its
    identity or storage; `version` is the policy's own count of `update_weights` calls."""
    return (version, *((id(p), p.data_ptr(), p._version) for p in model.parameters()))


class PrefixCache:
    """Token sequence -> its KV, per call or lasting (module docstring)."""

    def __init__(self, max_bytes: int, *, lasting: bool = False) -> None:
        self.max_bytes = max_bytes
        self.lasting = lasting
        self._fingerprint: Fingerprint | None = None
        # token sequence -> (its KV, how many rows ended with it: each continues once)
        # what `take` serves (per call: the previous call's; lasting: oldest stored first)
        self._serving: OrderedDict[_Key, tuple[Entry, int]] = OrderedDict()
        self._stored: dict[_Key, tuple[Entry, int]] = {}  # per call: this call's
        self._bytes = 0  # held by the entries `store` fills (`_stored`, or lasting `_serving`)
        self.reused_tokens = 0  # over the cache's life, for tests and benchmarks
        self.prompt_tokens = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the entries stored and not yet freed (per call: this call's)."""
        return self._bytes

    def check_weights(self, fingerprint: Fingerprint) -> None:
        """Empty the cache when the weights changed since the last check."""
        if fingerprint != self._fingerprint:
            self._serving, self._stored, self._bytes = OrderedDict(), {}, 0
            self._fingerprint = fingerprint

    def begin(self, fingerprint: Fingerprint) -> None:
        """A `generate` call starts: the last call's entries serve it (none if the weights
        changed since). Lasting: only the weights are checked."""
        self.check_weights(fingerprint)
        if not self.lasting:
            self._serving = OrderedDict(self._stored)
            self._stored, self._bytes = {}, 0

    def end(self) -> None:
        """The call is over: entries it did not use belong to ended episodes (per call)."""
        if not self.lasting:
            self._serving = OrderedDict()

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
                        if self.lasting:
                            self._bytes -= entry.nbytes
                    return entry
        return None

    def store(self, tokens: Sequence[int], entry: Entry) -> None:
        """Keep `entry`, the KV of `tokens`, for a turn that continues them."""
        if entry.length != len(tokens):
            raise ValueError(
                f"prefix cache: {entry.length} cached positions for {len(tokens)} tokens"
            )
        key = tuple(tokens)
        target = self._serving if self.lasting else self._stored
        if key in target:  # the same conversation in another row
            kept, rows = target[key]
            target[key] = (kept, rows + 1)
            if self.lasting:
                self._serving.move_to_end(key)
        elif self.lasting:
            self._store_evicting(key, entry)
        elif self._bytes + entry.nbytes <= self.max_bytes:
            self._stored[key] = (entry, 1)
            self._bytes += entry.nbytes

    def _store_evicting(self, key: _Key, entry: Entry) -> None:
        """Lasting: add `entry`, then free the least recently stored while over the cap."""
        if entry.nbytes > self.max_bytes:
            return
        self._serving[key] = (entry, 1)
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            _, (old, _) = self._serving.popitem(last=False)
            self._bytes -= old.nbytes


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
