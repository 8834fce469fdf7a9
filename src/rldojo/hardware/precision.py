"""Which precision to generate and train in, chosen by measurement on this machine.

CPUs of the same family differ: with AVX-512 bf16 units (AMD Zen 4, Intel Sapphire
Rapids) a bf16 matmul runs about 2x faster than fp32; on an AVX2-only CPU it runs about
30x *slower* (2.2 vs 66 GFLOP/s measured on an AVX2-only EPYC), because there is no
bf16 hardware and each product is emulated. So `"auto"` (the default for
`model.generation_dtype` and `model.autocast_bf16`) does not guess from the CPU's name:
it times a matmul of the shape the model's layers use in both dtypes and picks bf16 only
when it is clearly faster (`BF16_MIN_SPEEDUP`). The result is cached per machine (CPU
model, torch capability, torch version, threads) in the rldojo cache, so the probe
(~0.3 s) runs once in a while rather than in every process. Not forever: one measurement
taken while the machine was busy would otherwise decide for good. A cached result is
measured again when the CPU flags changed (a VM moved to another host, a hypervisor that
masks AVX-512), the torch version changed (new kernels), or it is older than
`PROBE_MAX_AGE_S`; `rldojo doctor --reprobe` measures again at once
(`cached_probe(refresh=True)`).
On a CUDA device bf16 is chosen without a probe (tensor cores). Explicit values win.

`choose` is the pure decision (capability and probe results in, choice and reason out);
`resolve_precision` adds the probe, its cache and the config's explicit values.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from rldojo.cache import cache_dir

Dtype = Literal["bfloat16", "float32"]

# bf16 must beat fp32 by this much: the generation copy and autocast casts cost time
# of their own, and a near tie is not worth the bf16 sampler/trainer mismatch.
BF16_MIN_SPEEDUP = 1.2
# The probe's shape: a decode batch of 64 rows through SmolLM2's MLP (576 -> 1536).
PROBE_SHAPE = (64, 576, 1536)
PROBE_SECONDS = 0.1  # per dtype, after one warm-up call
PROBE_MAX_AGE_S = 30 * 24 * 3600.0
"""A cached probe older than this (30 days) is measured again: often enough that a
measurement taken under load does not decide for good, rarely enough that the ~0.3 s
probe is not felt."""


@dataclass(frozen=True)
class MatmulProbe:
    """Measured matmul throughput on this machine, GFLOP/s."""

    fp32: float
    bf16: float


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run, and why it was chosen."""

    generation_dtype: Dtype
    """Dtype of the sampler's weights (the trainer's master weights stay fp32)."""
    autocast_bf16: bool
    """Whether the training forward runs under bf16 autocast."""
    device: str
    capability: str
    """torch's CPU capability (`AVX2`, `AVX512`, ...) or the CUDA device name."""
    probe: MatmulProbe | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["probe_gflops"] = out.pop("probe")
        return out

    def describe(self) -> str:
        """One line for a run's console: both dtypes and why they were chosen."""
        autocast = " + bf16 autocast" if self.autocast_bf16 else ""
        return f"generation {self.generation_dtype}, training fp32{autocast} ({self.reason})"

    def torch_generation_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.generation_dtype == "bfloat16" else torch.float32


def cpu_capability() -> str:
    """torch's view of the CPU's vector units, e.g. `AVX2` or `AVX512`."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # older torch builds: no capability query
        return "unknown"


def choose(device: str, capability: str, probe: MatmulProbe | None) -> tuple[Dtype, str]:
    """The dtype for `device`, from the probe (pure: injected values in, choice out)."""
    if device.startswith("cuda"):
        return "bfloat16", f"CUDA device {capability}: bf16 tensor cores"
    if probe is None:
        return "float32", f"CPU {capability}: no probe, fp32 is the safe choice"
    ratio = probe.bf16 / max(probe.fp32, 1e-9)
    figures = f"bf16 {probe.bf16:.1f} vs fp32 {probe.fp32:.1f} GFLOP/s ({ratio:.2f}x)"
    if ratio >= BF16_MIN_SPEEDUP:
        return "bfloat16", f"CPU {capability}: {figures}, bf16 is faster"
    return "float32", f"CPU {capability}: {figures}, bf16 is not {BF16_MIN_SPEEDUP}x faster"


def measure_matmul(dtype: torch.dtype, seconds: float = PROBE_SECONDS) -> float:
    """GFLOP/s of `PROBE_SHAPE` matmuls in `dtype` with torch's current threads."""
    m, k, n = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)  # [M, K]
    b = torch.randn(k, n, generator=gen).to(dtype)  # [K, N]
    torch.matmul(a, b)  # warm-up: kernel selection, page faults
    reps, started = 0, time.perf_counter()
    while True:
        torch.matmul(a, b)
        reps += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and reps >= 3:
            break
    return 2.0 * m * k * n * reps / elapsed / 1e9


def probe_matmul() -> MatmulProbe:
    return MatmulProbe(fp32=measure_matmul(torch.float32), bf16=measure_matmul(torch.bfloat16))


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux: the platform's name stands in
        return []


def machine_key() -> str:
    """What the probe's result depends on: CPU model, capability, torch, threads."""
    model = platform.processor() or platform.machine()
    for line in _cpuinfo():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{model}|{cpu_capability()}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def cpu_flags() -> str:
    """A short digest of the CPU's feature flags (`flags` on x86, `Features` on Arm):
    the same model name can come with other vector units, e.g. on another VM host."""
    for line in _cpuinfo():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            text = " ".join(sorted(value.split()))
            return hashlib.sha256(text.encode()).hexdigest()[:16]
    return "unknown"


def _stale(entry: dict[str, Any], now: float, max_age_s: float) -> str | None:
    """Why a cached entry must be measured again, or None when it still holds."""
    try:
        age = now - float(entry["measured_at"])
    except (KeyError, TypeError, ValueError):
        return "no date"  # written before entries were dated: its age is unknown
    if entry.get("cpu_flags") != cpu_flags():
        return "other CPU flags"
    if entry.get("torch") != torch.__version__:
        return "another torch version"
    if not 0.0 <= age <= max_age_s:  # a date in the future is not trusted either
        return f"{age / 86400:.0f} days old"
    return None


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write_cache(path: Path, known: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:  # a read-only cache only costs the probe next time
        pass


def cached_probe(
    path: Path | None = None,
    measure: Callable[[], MatmulProbe] | None = None,
    *,
    refresh: bool = False,
    now: float | None = None,
    max_age_s: float = PROBE_MAX_AGE_S,
) -> MatmulProbe:
    """The probe for this machine, kept in `path` (default: the cache) and measured again
    when the entry is stale (see the module docstring) or `refresh` asks; `measure`
    defaults to `probe_matmul`."""
    path = path or cache_dir() / "precision.json"
    now = time.time() if now is None else now
    key = machine_key()
    known = _read_cache(path)
    entry = known.get(key)
    if not refresh and isinstance(entry, dict) and _stale(entry, now, max_age_s) is None:
        try:
            return MatmulProbe(fp32=float(entry["fp32"]), bf16=float(entry["bf16"]))
        except (KeyError, TypeError, ValueError):
            pass
    probe = (measure or probe_matmul)()
    stamp = {"measured_at": now, "cpu_flags": cpu_flags(), "torch": torch.__version__}
    known[key] = asdict(probe) | stamp
    _write_cache(path, known)
    return probe


def resolve_precision(
    generation_dtype: str = "auto",
    autocast_bf16: bool | str = "auto",
    *,
    device: str = "cpu",
    probe: Callable[[], MatmulProbe] | None = None,
) -> Precision:
    """Resolve `"auto"` values; explicit ones are kept. `probe` defaults to the cached one
    and runs only when something is `"auto"` on a CPU."""
    on_cuda = device.startswith("cuda")
    capability = torch.cuda.get_device_name(torch.device(device)) if on_cuda else cpu_capability()
    auto = generation_dtype == "auto" or autocast_bf16 == "auto"
    measured = (probe or cached_probe)() if auto and not on_cuda else None
    if auto:
        choice, reason = choose(device, capability, measured)
    else:
        choice, reason = "float32", "explicit"
    gen: Dtype = choice if generation_dtype == "auto" else generation_dtype  # type: ignore[assignment]
    autocast = choice == "bfloat16" if autocast_bf16 == "auto" else bool(autocast_bf16)
    if not auto:
        reason = "set explicitly in the config"
    elif generation_dtype != "auto" or autocast_bf16 != "auto":
        reason += " (the other value set explicitly)"
    return Precision(gen, autocast, device, capability, measured, reason)
