"""Serving a LoRA-wrapped trainer through vLLM as a vLLM LoRA adapter (`VLLMPolicy`).

The engine starts on the BASE weights with `enable_lora=True` (`max_lora_rank`: the
adapter's rank rounded up to one vLLM accepts, `max_loras=1`). Each version of the
trainer's adapter is written with peft's `save_pretrained` to a fresh directory (vLLM
0.32 loads adapters from disk only: `LRUCacheWorkerLoRAManager._load_adapter` reads
`adapter_config.json` and the weights from `lora_path`) and loaded at once with
`llm_engine.add_lora`, under a new `lora_int_id` and name, so vLLM cannot serve a cached
old one (it keys loaded adapters by id, and its prefix cache by name and path); each
`generate` passes that `LoRARequest`. The previous version is then removed from the
engine and its directory deleted: the base weights are never reloaded.

Where vLLM cannot serve the adapter (a rank above 512, an adapter feature vLLM lacks such
as DoRA, an architecture without LoRA support in vLLM, or an engine started without
LoRA), the policy falls back to merging the adapters into a copy of the model and
reloading the full weights after each step: slower, same samples, so a warning rather
than an error (`VLLMPolicy.weight_sync`, `VLLMPolicy.lora_fallback` record it).

On vLLM-CPU the adapter path costs more than it saves: its LoRA ops are PyTorch fallbacks
(`vllm/lora/ops/torch_ops/lora_ops.py` gathers the adapter's weights per token) and LoRA
turns torch.compile off (`vllm/platforms/cpu.py`), so SmolLM2 r16 generates ~3x slower
while a publish saves ~1 s of reload a step; `VLLMPolicy(lora_adapters=False)` merges.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from rldojo.policy.lora import base_of

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel
    from vllm import LLM
    from vllm.lora.request import LoRARequest

# vLLM's `LoRAConfig.max_lora_rank` takes these values only.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# One id sequence for the process: policies sharing an engine never reuse an id.
_LORA_IDS = itertools.count(1)


def adapter_rank(model: PeftModel) -> int:
    """The adapter's largest rank (`r`, or a per-module `rank_pattern` entry)."""
    from peft import LoraConfig

    cfg = model.peft_config[model.active_adapter]
    assert isinstance(cfg, LoraConfig), "adapters other than LoRA's"
    return max([int(cfg.r), *(int(r) for r in (cfg.rank_pattern or {}).values())])


def engine_lora_kwargs(model: PeftModel) -> dict[str, int]:
    """`vllm.LLM` arguments that let it serve this model's adapter."""
    rank = next(r for r in VLLM_LORA_RANKS if r >= adapter_rank(model))
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}


def unservable_reason(model: PeftModel) -> str | None:
    """Why vLLM cannot start with this model's adapter as a LoRA adapter (None: it can,
    as far as can be told before the first `add_lora`, which checks the rest)."""
    rank = adapter_rank(model)
    if rank > VLLM_LORA_RANKS[-1]:
        return f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})"
    try:
        from vllm.config.lora import LoRAConfig
        from vllm.lora.peft_helper import PEFTHelper
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_lora
    except Exception:  # another vLLM layout: the first add_lora says
        return None
    cfg = model.peft_config[model.active_adapter].to_dict()
    max_rank = engine_lora_kwargs(model)["max_lora_rank"]
    try:
        PEFTHelper.from_dict(cfg).validate_legal(LoRAConfig(max_lora_rank=max_rank))
    except (ValueError, TypeError) as exc:
        return f"vLLM does not serve this adapter ({exc})"
    for arch in base_of(model).config.architectures or []:
        cls = ModelRegistry._try_load_model_cls(arch)
        if cls is not None and not supports_lora(cls):
            return f"vLLM's {arch} has no LoRA support"
    return None


def engine_has_lora(engine: LLM) -> bool:
    """Whether an engine someone else started (`VLLMPolicy(engine=...)`) serves LoRA."""
    config = getattr(getattr(engine, "llm_engine", None), "vllm_config", None)
    return getattr(config, "lora_config", None) is not None


def base_model(model: PeftModel) -> PreTrainedModel:
    """A copy of the base model under the adapters (not merged), to start the engine on."""
    base: PreTrainedModel = copy.deepcopy(model).unload()
    return base


class AdapterPublisher:
    """Writes each version of a peft model's adapter to its own directory and loads it
    into the engine; `request` is the `LoRARequest` of the current version."""

    def __init__(self, llm: LLM, model: PeftModel) -> None:
        self.llm, self.model = llm, model
        self.root: str | None = tempfile.mkdtemp(prefix="rldojo_vllm_lora_")
        self.request: LoRARequest | None = None

    def publish(self) -> LoRARequest:
        """Save and load the current adapter under a new id; drop the previous one. An
        adapter vLLM refuses raises here (`ValueError`), the previous one still served."""
        from vllm.lora.request import LoRARequest

        assert self.root is not None, "publish after close"
        lora_id = next(_LORA_IDS)
        path = os.path.join(self.root, f"v{lora_id}")
        # peft: adapter_config.json and the adapter's weights; no embeddings (the vocab is
        # the base's), which also spares peft's Hub lookup of the base's config
        self.model.save_pretrained(path, save_embedding_layers=False)
        request = LoRARequest(f"rldojo-lora-{lora_id}", lora_id, path)
        try:  # loads it now: a bad adapter fails here, not in the middle of a generate
            self.llm.llm_engine.add_lora(request)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        old, self.request = self.request, request
        if old is not None:  # with max_loras = 1, vLLM's LRU may have evicted it already
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return request

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
