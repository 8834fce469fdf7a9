"""Which torch device a run computes on (`run.device`), and where a model's weights are.

`resolve_device` turns the config's `"auto" | "cpu" | "cuda" | "cuda:N"` into a concrete
`torch.device`: `auto` is CUDA device 0 when torch sees a GPU, else the CPU (the default
on CPU-only machines, whose path is unchanged). A CUDA device that is not there is a
`ConfigError` of one line, raised before any model loads. The decision is a pure function
of the spec and what CUDA reports (`cuda_count`), so it is tested without a GPU.
"""

from __future__ import annotations

import torch

from rldojo.config import ConfigError


def cuda_device_count() -> int:
    """GPUs torch can use here (0 on a CPU-only build or machine)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver reads as no GPU, doctor says more
        return 0


def cuda_unavailable_reason() -> str:
    """Why CUDA is not usable, in a few words (for errors and `rldojo doctor`)."""
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU"


def resolve_device(spec: str = "auto", *, cuda_count: int | None = None) -> torch.device:
    """The device for `run.device = spec`; `cuda_count` defaults to what torch reports."""
    count = cuda_device_count() if cuda_count is None else cuda_count
    if spec == "auto":
        return torch.device("cuda", 0) if count > 0 else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = 0 if spec == "cuda" else int(spec.split(":", 1)[1])
        if count == 0:
            raise ConfigError(
                f"run.device: {spec!r} asked for, but {cuda_unavailable_reason()}"
                ' (use run.device="auto" or "cpu")'
            )
        if index >= count:
            raise ConfigError(
                f"run.device: {spec!r} asked for, but this machine has "
                f"{count} CUDA device(s) (cuda:0..cuda:{count - 1})"
            )
        return torch.device("cuda", index)
    raise ConfigError(f"run.device: {spec!r} is not auto, cpu, cuda or cuda:N")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (CPU for a model without parameters)."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def autocast_device_type(device: torch.device) -> str:
    """`torch.autocast`'s device type for `device` (`"cpu"`, `"cuda"`; meta computes as cpu)."""
    return "cuda" if device.type == "cuda" else "cpu"
