"""Loading a model straight into its shards: no rank holds the whole trained model.

    model, tokenizer, whole = load_sharded(config.model, checkpoint, dist, device,
                                           bf16=bf16, offload=config.run.cpu_offload,
                                           whole=True)

On several ranks (`Dist.sharded`) every rank builds the architecture with its weights on
the meta device (from the model's `config.json`; buffers such as the rotary frequencies
are computed as usual), wraps it with LoRA adapters when `model.lora` is set (the
adapters are real tensors, made as `load_training_model` makes them), shards it with
FSDP2 (`shard_model`), allocates its shards alone and fills them:

- from safetensors files (a model directory, a checkpoint in the `hf` format, the
  built-in SmolLM2's export, a hub id already in the local Hugging Face cache): each rank
  reads, tensor by tensor, only the rows of its own shard (`Shard(0)`);
- from a `dcp` checkpoint (`run.checkpoint_format = "dcp"`): torch.distributed.checkpoint
  reads each rank's shards, resharded to this world;
- from anything else (`tiny-random`, a hub id to download, files whose tensor names are
  not the model's): rank 0 loads the whole model (`load_training_model`) and broadcasts
  it tensor by tensor, each rank keeping its shard (`set_model_state_dict` with
  `broadcast_from_rank0`).

The weights are bit for bit those of loading the whole model and sharding it
(`tests/training/test_sharded_load.py`); the output layer stays tied to the embedding
where the model ties them. `whole=True` also gives rank 0 an unsharded copy to sample
from, loaded directly (in the broadcast case the model rank 0 loaded anyway), its
adapters gathered from the shards so that the two agree: one whole model, on rank 0 only
(None on the others). In one process unsharded (`Dist.sharded` false) these are
`load_training_model` / `load_reference` themselves, and `whole` is the model.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch

from rldojo.config import ModelConfig
from rldojo.policy import lora as lora_lib
from rldojo.policy.attention import register_safe_sdpa, use_safe_sdpa
from rldojo.policy.given_models import is_given
from rldojo.policy.models import SMOLLM2, load_model, load_tokenizer, smollm2_dir
from rldojo.policy.training_model import Loader, load_reference, load_training_model
from rldojo.store.checkpoint import is_sharded_checkpoint
from rldojo.training.distributed import Dist, gather_into, shard_model

__all__ = ["Loaded", "load_sharded", "load_sharded_frozen", "sharded_reference"]


class Loaded(NamedTuple):
    """A loaded model: `model` (sharded on several ranks), its `tokenizer`, and `whole`,
    rank 0's unsharded copy when asked for (else None; the model itself when unsharded)."""

    model: Any
    tokenizer: Any
    whole: Any


def load_sharded(model: ModelConfig, checkpoint: Path | None, d: Dist, device: torch.device,
                 *, bf16: bool = False, offload: bool = False, load: Loader = load_model,
                 whole: bool = False) -> Loaded:  # fmt: skip
    """What `load_training_model(model, checkpoint, device, load)` loads (the checkpoint's
    weights, or `model.name`'s, LoRA adapters included), in train mode, each rank holding
    only its shards (`shard_model(..., bf16, offload=offload)`). `whole`: rank 0 also
    gets a whole copy for sampling. Collective when `d.sharded`."""
    if not d.sharded or is_given(model.name):  # a given object trains in place
        net, tokenizer = load_training_model(model, checkpoint, device, load)
        kept = net if whole else None
        if d.sharded:
            kept = copy.deepcopy(net) if whole and d.main else None
            shard_model(net, d, device, bf16, offload=offload)
        return Loaded(net, tokenizer, kept)
    adapter = checkpoint if model.lora is not None else None
    name = str(checkpoint) if checkpoint is not None and adapter is None else model.name

    def load_whole() -> tuple[Any, Any]:
        return load_training_model(model, checkpoint, device, load)

    def wrap(base: Any) -> Any:
        return _with_lora(base, model, adapter)

    net, tokenizer, kept = _load(name, d, device, bf16, offload, load_whole, wrap, whole)
    net.train()
    if model.lora is not None and whole:  # every rank sends its adapters' shards
        gather_into(net, kept, d, adapters_only=True)
    return Loaded(net, tokenizer, kept)


def load_sharded_frozen(name: str, d: Dist, device: torch.device, *, bf16: bool = False,
                        offload: bool = False, load: Loader = load_model,
                        whole: bool = False) -> Loaded:  # fmt: skip
    """The model `name` frozen (no gradients) in eval mode, sharded like the trained one
    (a KL reference, a distillation teacher); `whole` as in `load_sharded`."""
    if not d.sharded:
        net, tokenizer = load(name)
        net = net.to(device).eval().requires_grad_(False)
        return Loaded(net, tokenizer, net if whole else None)

    def load_whole() -> tuple[Any, Any]:
        net, tokenizer = load(name)
        return net.to(device), tokenizer

    net, tokenizer, kept = _load(name, d, device, bf16, offload, load_whole, None, whole)
    if kept is not None:
        kept.eval().requires_grad_(False)
    return Loaded(net.eval().requires_grad_(False), tokenizer, kept)


def sharded_reference(model: ModelConfig, trained: Any, checkpoint: Path | None, d: Dist,
                      device: torch.device, *, bf16: bool = False, offload: bool = False,
                      load: Loader = load_model) -> Any:  # fmt: skip
    """The KL reference `load_reference` gives (the initial model, frozen, eval mode),
    sharded like `trained` when `d.sharded`: read into its shards from `model.name`, or,
    for a model object given to the run, `load_reference`'s copy sharded."""
    if d.sharded and not is_given(model.name):
        return load_sharded_frozen(model.name, d, device, bf16=bf16, offload=offload,
                                   load=load).model  # fmt: skip
    ref = load_reference(model, trained, checkpoint, device, load)
    return shard_model(ref, d, device, bf16, offload=offload) if d.sharded else ref


def _load(name: str, d: Dist, device: torch.device, bf16: bool, offload: bool,
          load_whole: Callable[[], tuple[Any, Any]], wrap: Callable[[Any], Any] | None,
          whole: bool) -> tuple[Any, Any, Any]:  # fmt: skip
    """`(sharded model, tokenizer, rank 0's whole copy or None)` of the weights `name`
    holds; `wrap` adds the adapters to the bare architecture."""
    files, net, full = _weights_dir(name), None, None  # full: rank 0's whole model
    tokenizer: Any = None
    if files is not None:
        tokenizer = load_tokenizer(name)
        net = _bare(_config(files), tokenizer)
        if not is_sharded_checkpoint(files) and not _in_files(net, files):
            files = None  # the files name tensors otherwise: rank 0 loads the model whole
    if files is None:
        full, tokenizer = load_whole() if d.main else (None, None)
        config, tokenizer = d.broadcast((getattr(full, "config", None), tokenizer))
        net = _bare(config, tokenizer)
    if wrap is not None:
        with _adapters_stay_real(), torch.random.fork_rng(enabled=full is not None):
            net = wrap(net)  # rank 0's whole model made its adapters: not drawn twice
    shard_model(net, d, device, bf16, offload=offload)
    pending = _materialize(net, torch.device("cpu") if offload else device)
    if files is None:
        _fill_from_rank0(net, full)
    elif is_sharded_checkpoint(files):
        _fill_from_dcp(net, files)
    else:
        _fill_from_files(net, pending, files)
    kept = full if whole and d.main else None
    if whole and d.main and kept is None:
        with torch.random.fork_rng():  # its adapters are replaced by the shards' own
            kept = load_whole()[0]
    return net, tokenizer, kept


def _weights_dir(name: str) -> Path | None:
    """The local directory whose files hold `name`'s weights (safetensors, or a `dcp`
    checkpoint), None when rank 0 must load the model whole."""
    if is_given(name):
        return None
    if name == SMOLLM2:
        return smollm2_dir()
    path = Path(name).expanduser()
    if not path.is_dir() and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        path = _cached_hub_snapshot(name) or path
    if not (path / "config.json").is_file():
        return None
    if is_sharded_checkpoint(path) or _safetensors_files(path):
        return path
    return None


def _cached_hub_snapshot(repo: str) -> Path | None:
    """A hub model already in the local Hugging Face cache (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # not cached, or no huggingface_hub: rank 0 loads it
        return None


def _safetensors_files(path: Path) -> dict[str, Path]:
    """Each tensor name of a model directory's safetensors files, to its file."""
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            found.update(dict.fromkeys(f.keys(), file))
    return found


def _config(path: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


def _bare(config: Any, tokenizer: Any) -> Any:
    """The architecture of `config` in fp32 with its parameters on the meta device (its
    buffers real), tied as the model ties them, prepared as `load_model` prepares a
    model."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    register_safe_sdpa()  # a config rank 0 broadcast may name it already
    with init_empty_weights(include_buffers=False):
        net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    net.tie_weights()  # from_config leaves meta parameters untied
    net.generation_config.pad_token_id = tokenizer.pad_token_id
    use_safe_sdpa(net)
    return net


def _in_files(net: Any, path: Path) -> bool:
    """Whether `path`'s safetensors files hold every parameter of `net` by its name."""
    names = _safetensors_files(path)
    return all(name in names for name, _ in net.named_parameters())


def _with_lora(base: Any, model: ModelConfig, adapter: Path | None) -> Any:
    """`base` wrapped as `load_training_model` wraps it: fresh adapters, or a LoRA
    checkpoint's to resume."""
    if model.lora is None:
        return base
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Already found a `peft_config`")
        if adapter is not None and lora_lib.is_adapter_dir(adapter):
            return lora_lib.load_adapter(base, adapter, trainable=True)
        return lora_lib.add_lora(base, model.lora, model.name)


@contextmanager
def _adapters_stay_real() -> Iterator[None]:
    """peft makes new adapters on the host, initialised, then moves them to their base
    layer's device, which here is the meta device (their values lost): while they are
    made, nothing moves to the meta device."""
    move = torch.nn.Module.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta":
            return self if dtype is None else move(self, dtype=dtype)
        return move(self, *args, **kwargs)

    torch.nn.Module.to = to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.to = move  # type: ignore[method-assign]


def _local(t: Any) -> torch.Tensor:
    """A tensor's local part: a DTensor's shard, a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _materialize(net: Any, device: torch.device) -> set[str]:
    """Allocate the shards of `net`'s meta parameters on `device` (`to_empty`; the host
    under CPU offload), keeping what is already real: the adapters' values, and the
    buffers themselves (where FSDP put them: with the computation, also under offload).
    Returns the names of the parameters still to fill."""
    named = list(net.named_parameters())
    kept = {n: _local(p).detach().clone() for n, p in named if not _local(p).is_meta}
    buffers = [(m, n, b) for m in net.modules() for n, b in m._buffers.items() if b is not None]
    net.to_empty(device=device)
    for module, name, buffer in buffers:
        module._buffers[name] = buffer
    with torch.no_grad():
        for n, p in net.named_parameters():
            if n in kept:
                _local(p).copy_(kept[n])
    return {n for n, _ in named if n not in kept}


def _file_key(name: str) -> str:
    """A parameter's name as the base model's files name it (peft's wrapping removed)."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _fill_from_files(net: Any, pending: set[str], path: Path) -> None:
    """Each pending parameter's shard read from `path`'s safetensors files: only its own
    rows, one tensor's file mapped at a time."""
    from safetensors import safe_open

    files = _safetensors_files(path)
    with torch.no_grad():
        for name, param in net.named_parameters():
            if name not in pending:
                continue
            local, start, key = _local(param), _shard_start(param), _file_key(name)
            with safe_open(str(files[key]), framework="pt") as f:
                part = f.get_slice(key)[start : start + local.shape[0]] if local.dim() \
                    else f.get_tensor(key)  # fmt: skip
            local.copy_(part)


def _shard_start(param: Any) -> int:
    """The first row of this rank's shard of `param` (FSDP2: `Shard(0)`, torch.chunk's
    split: ceil(rows / ranks) rows a rank, the last ones shorter or empty)."""
    if not hasattr(param, "device_mesh"):
        return 0
    from torch.distributed.tensor import Shard

    mesh, placements = param.device_mesh, tuple(param.placements)
    if placements != (Shard(0),) or mesh.ndim != 1:
        raise ValueError(f"unexpected placement {placements} of a sharded parameter")
    rows = param.shape[0]
    start = -(-rows // mesh.size()) * mesh.get_local_rank()
    if _local(param).shape[0] != max(0, min(-(-rows // mesh.size()), rows - start)):
        raise ValueError("a shard's rows are not torch.chunk's")
    return min(start, rows)


def _fill_from_dcp(net: Any, path: Path) -> None:
    """The weights of a `dcp` checkpoint read into the shards (resharded to this world)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(net)
    dcp.load({"model": state}, checkpoint_id=str(path / "dcp"))
    set_model_state_dict(net, state)


def _fill_from_rank0(net: Any, full: Any) -> None:
    """Rank 0's whole model's weights broadcast; every rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    weights = copy.copy(full.state_dict()) if full is not None else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(net, weights, options=options)
