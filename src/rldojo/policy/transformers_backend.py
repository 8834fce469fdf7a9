"""The in-process transformers backend: generation for the trainer's own model.

The trainer optimises the model in float32; generation may run on a bf16 copy (about
2x faster on CPUs with bf16 units, ~30x slower on AVX2-only CPUs: `"auto"` measures, see
`rldojo.hardware.precision`). When generation runs in the model's own dtype it shares
the trainer's weights. In another dtype (bf16), with synchronous rollouts, the trainer
makes the copy transient (`transient_copy`): each `generate` call casts the trainer's
current weights into it and frees them when it returns, so the training step's peak
memory holds no second copy (casting SmolLM2 takes well under a second; a generation
call takes seconds). Asynchronous generation runs while the trainer updates its
weights, so it keeps a lasting copy, and after each optimizer step the trainer calls
`update_weights`, which copies the new weights in.

Devices and LoRA: the copy is made on the model's device. Under LoRA (`rldojo.policy.
lora`) the model is a `peft` model. A transient copy is a plain model: each `generate`
casts the merged weights (base + the adapters' current delta) into it, so decoding runs
no adapter modules (SmolLM2 with r16 adapters on 10 layers: `benchmarks/
multiturn_generation.py`). Otherwise generation samples through the adapters, and
`update_weights` copies only the trainable adapter weights into a lasting copy (the
frozen base is the same in both).

Thread safety (asynchronous rollouts): `generate` runs under a lock. `update_weights`
never waits for a generation in flight: if one is running it stages the new weights and
the next `generate` call loads them first, so each call samples from one policy version.

One request at a time (`agenerate`, the `EnginePolicy` protocol): a `DecodeEngine`
(`rldojo.policy.engine`), started at the first request, decodes every request in flight
as one batch on its own thread. It takes the same lock for each prefill or decode step,
not for a request's life, so `generate` calls and weight updates go between its steps;
it loads staged weights before a step (a request in flight then finishes on the new
weights). A transient copy holds weights while the engine is busy: they are cast at the
first step after it was idle (and again if the trained weights change meanwhile) and
freed when nothing is in flight, so the trainer's synchronous step, which runs after its
rollouts, still holds no second copy. The engine keeps its own lasting prefix cache of
`prefix_cache_mb` (an episode's next turn comes whenever its environment answers); the
`generate` calls' cache keeps its per-call lifetime. `close` stops the engine.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from rldojo.policy import lora
from rldojo.policy.base import Tokenizer, chat_template_ids, completion_text, stop_ids
from rldojo.policy.engine import DEFAULT_MAX_BATCH, STATS, DecodeEngine, EngineClosedError
from rldojo.policy.prefix_cache import Fingerprint, PrefixCache, weights_fingerprint
from rldojo.policy.sampling import SampledRow, StepHook, sample
from rldojo.types import Completion, Message, SamplingParams

if TYPE_CHECKING:
    from peft import PeftModel


def _resolve_dtype(generation_dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A torch dtype or None (the model's own); `"auto"`: measured on this machine."""
    if not isinstance(generation_dtype, str):
        return generation_dtype
    if generation_dtype != "auto":
        raise ValueError(
            f"generation_dtype must be a torch dtype or 'auto', got {generation_dtype!r}"
        )
    from rldojo.hardware import resolve_precision

    return resolve_precision(autocast_bf16=False).torch_generation_dtype()


class TransformersPolicy:
    """Samples from a transformers causal LM; shares weights with the trainer's model."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        generation_dtype: torch.dtype | str | None = "auto",
        max_batch: int | None = None,
        separate_copy: bool = False,
        transient_copy: bool = False,
        chunk_size: int | None = None,
        merge_lora: bool = True,
        prefix_cache_mb: int = 0,
    ) -> None:
        """`max_batch` (default 64): rows decoded at once; finished rows' slots are refilled
        with pending prompts (continuous batching, see `rldojo.policy.sampling`).
        `chunk_size` is its former name, still accepted. `generation_dtype`: a torch
        dtype, None (the model's own) or `"auto"` (measured, `rldojo.hardware.precision`).
        `transient_copy`: a copy in another dtype holds weights only while it samples
        (the trainer's synchronous rollouts); ignored with `separate_copy`. `merge_lora`:
        a transient copy of a LoRA model holds merged weights (False: the adapters, as a
        lasting copy does; a baseline for `benchmarks/multiturn_generation.py`).
        `prefix_cache_mb`: memory for the last call's conversations' keys and values, so
        a next turn prefills only its new tokens (`rldojo.policy.prefix_cache`; 0: off);
        the engine (`agenerate`) keeps a lasting cache of its own of that size."""
        if max_batch is not None and chunk_size is not None and max_batch != chunk_size:
            raise ValueError("pass max_batch or its old name chunk_size, not both")
        max_batch = max_batch if max_batch is not None else chunk_size
        max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.tokenizer = tokenizer
        self.version = 0
        self.max_batch = max_batch
        self._train_model = model
        self._lock = threading.Lock()  # the generation model runs under it
        self._staged: tuple[dict[str, Any], int] | None = None
        self._held: Fingerprint | None = None  # transient: the trained weights it holds now
        self._engine: DecodeEngine | None = None  # started by the first `agenerate`
        self._engine_busy = False  # the engine has requests in flight (under `_lock`)
        self._engine_lock = threading.Lock()  # starts and stops it (not `_lock`: held per step)
        self._closed = False
        train_dtype = next(model.parameters()).dtype
        generation_dtype = _resolve_dtype(generation_dtype)
        same_dtype = generation_dtype is None or generation_dtype == train_dtype
        self._transient = transient_copy and not same_dtype and not separate_copy
        # the LoRA model whose merged weights a transient copy holds (None: no merging)
        self._merged = (
            model if self._transient and merge_lora and lora.is_peft_model(model) else None
        )
        if same_dtype and not separate_copy:
            self._gen_model = model
        else:
            plain: torch.nn.Module = (
                lora.merged_copy(self._merged) if self._merged is not None else copy.deepcopy(model)
            )
            self._gen_model = plain.to(generation_dtype or train_dtype)
        if self._merged is not None:
            self._check_merged_names(self._merged)
        if self._transient:
            self._drop_weights()
        self._gen_model.eval()
        self.eos_ids = stop_ids(tokenizer)
        self.prefix_cache = PrefixCache(prefix_cache_mb << 20) if prefix_cache_mb else None

    def _check_merged_names(self, model: PeftModel) -> None:
        """The merged weights of `model` name the plain copy's parameters, one for one."""
        with torch.no_grad():
            names = {name for name, _ in lora.merged_parameters(model)}
        if names != {name for name, _ in self._gen_model.named_parameters()}:
            raise RuntimeError("LoRA: the merged weights do not name the plain model's")

    def encode_chat(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        return chat_template_ids(self.tokenizer, messages, tools)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        *,
        on_step: StepHook | None = None,
    ) -> list[Completion]:
        """One completion per prompt; `on_step` sees every decode step's tokens as they are
        sampled (`rldojo.policy.sampling.DecodeStep`; `rldojo serve` streams them)."""
        with self._lock:
            fingerprint = self._ready_weights()
            try:
                return self._generate(prompts, sampling, fingerprint, on_step)
            finally:
                if not self._engine_busy:
                    self._release_weights()

    def _ready_weights(self) -> Fingerprint:
        """Before the generation model runs (under `_lock`): its weights current (staged
        ones loaded; a transient copy cast from the trained model unless it holds its
        current weights already). Returns the fingerprint of the weights it samples with."""
        if not self._transient:
            self._load_staged()
            return weights_fingerprint(self._gen_model, self.version)
        fingerprint = weights_fingerprint(self._train_model, self.version)
        if fingerprint != self._held:
            self._cast_weights()
            self._held = fingerprint
        return fingerprint

    def _release_weights(self) -> None:
        """Nothing samples any more (under `_lock`): a transient copy frees its weights."""
        if self._transient:
            self._drop_weights()
            self._held = None

    def _cast_weights(self) -> None:
        """The transient copy: the trainer's current weights (LoRA merged), cast to the
        sampler's dtype one tensor at a time."""
        target = dict(self._gen_model.named_parameters())
        with torch.no_grad():
            if self._merged is not None:
                source = lora.merged_parameters(self._merged)
            else:
                source = self._train_model.named_parameters()
            for name, tensor in source:
                target[name].data = tensor.detach().to(target[name].dtype)

    def _drop_weights(self) -> None:
        """Free the transient copy's weights (the module and its buffers stay)."""
        for param in self._gen_model.parameters():
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        fingerprint: Fingerprint,
        on_step: StepHook | None = None,
    ) -> list[Completion]:
        """Sample with the generation model; `fingerprint`: its weights' now (a change
        of theirs empties the prefix cache)."""
        was_training = self._gen_model.training
        self._gen_model.eval()
        if self.prefix_cache is not None:
            self.prefix_cache.begin(fingerprint)
        try:
            batch = sample(
                self._gen_model,
                self.tokenizer,
                [list(p) for p in prompts],
                sampling,
                self.eos_ids,
                max_batch=self.max_batch,
                prefix_cache=self.prefix_cache,
                on_step=on_step,
            )
        finally:
            self._gen_model.train(was_training)
            if self.prefix_cache is not None:
                self.prefix_cache.end()
        rows = zip(
            batch.token_ids, batch.logprobs, batch.entropies, batch.finish_reasons, strict=True
        )
        return [self._completion(SampledRow(*row), sampling) for row in rows]

    def _completion(self, row: SampledRow, sampling: SamplingParams) -> Completion:
        text = completion_text(self.tokenizer, row.token_ids, sampling.stop)
        return Completion(
            text, tuple(row.token_ids), tuple(row.logprobs), row.finish_reason, tuple(row.entropies)
        )

    async def agenerate(self, prompt: Sequence[int], sampling: SamplingParams) -> Completion:
        """One completion of `prompt`, decoded by the engine together with every other
        request in flight (module docstring); raises what the model raised, or
        `EngineClosedError` once the policy is closed."""
        row = await asyncio.wrap_future(self._decode_engine().submit(prompt, sampling))
        return self._completion(row, sampling)

    def engine_stats(self) -> dict[str, float]:
        """The engine's counters (`rldojo.policy.engine`; zeros before its first request)."""
        engine = self._engine
        return engine.stats() if engine is not None else dict.fromkeys(STATS, 0.0)

    def close(self) -> None:
        """Stop the engine (requests still pending fail); `generate` still works."""
        with self._engine_lock:
            self._closed = True
            engine = self._engine
        if engine is not None:
            engine.close()

    def _decode_engine(self) -> DecodeEngine:
        """The engine, started at the first request."""
        with self._engine_lock:
            if self._closed:
                raise EngineClosedError("the policy is closed")
            if self._engine is None:
                mb = self.prefix_cache.max_bytes if self.prefix_cache is not None else 0
                self._engine = DecodeEngine(
                    self._gen_model,
                    self.tokenizer,
                    self.eos_ids,
                    max_batch=self.max_batch,
                    prefix_cache=PrefixCache(mb, lasting=True) if mb else None,
                    host=_EngineHost(self),
                )
            return self._engine

    def update_weights(self, state_dict: dict[str, Any] | None = None) -> None:
        """Publish new weights (from the shared training model by default); `version` += 1.

        Loads them now when no generation is running, else stages a copy for the next call.
        """
        if self._gen_model is self._train_model or self._transient:
            if state_dict is not None:  # read from the trained model by the next generate
                self._train_model.load_state_dict(state_dict, strict=False)
            self.version += 1
            return
        source = state_dict if state_dict is not None else self._published_weights()
        if self._lock.acquire(blocking=False):
            try:
                self._staged = None
                self._copy_in(source)
                self.version += 1
            finally:
                self._lock.release()
            return
        dtype = next(self._gen_model.parameters()).dtype
        staged = {k: v.detach().to(dtype, copy=True) for k, v in source.items()}
        self._staged = (staged, (self._staged[1] if self._staged else self.version) + 1)

    def _published_weights(self) -> dict[str, Any]:
        """What changes in a step: the trainable weights (LoRA adapters) when the base is
        frozen, else the whole state dict."""
        named = list(self._train_model.named_parameters())
        trainable = {name: p for name, p in named if p.requires_grad}
        if trainable and len(trainable) < len(named):
            return trainable
        return dict(self._train_model.state_dict())

    def _load_staged(self) -> None:
        if self._staged is not None:
            weights, version = self._staged
            self._staged = None
            self._copy_in(weights)
            self.version = version

    def _copy_in(self, source: dict[str, Any]) -> None:
        with torch.no_grad():
            self._gen_model.load_state_dict(source, strict=False)


class _EngineHost:
    """Lends the policy's generation model to its engine, one step at a time
    (`rldojo.policy.engine.ModelHost`; module docstring)."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self._policy = policy

    @contextmanager
    def step(self) -> Iterator[Fingerprint]:
        policy = self._policy
        with policy._lock:
            policy._engine_busy = True
            fingerprint = policy._ready_weights()
            model = policy._gen_model
            was_training = model.training
            model.eval()
            try:
                yield fingerprint
            finally:
                model.train(was_training)

    def idle(self) -> None:
        with self._policy._lock:
            self._policy._engine_busy = False
            self._policy._release_weights()
