"""How busy the machine is, for benchmarks that flag runs other jobs slowed down."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def load_average() -> float:
    """1-minute load average: other work on the machine inflates wall times."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_probe() -> float:
    """GFLOP/s of a fixed fp32 matmul loop (~0.1 s): low values mean a busy machine."""
    import torch

    a = torch.ones(1024, 1024)
    a @ a  # warm-up
    t0 = time.perf_counter()
    for _ in range(8):
        a @ a
    return 8 * 2 * 1024**3 / (time.perf_counter() - t0) / 1e9


def cpu_flags() -> list[str]:
    """The vector-unit flags that decide which precision is fast (`lscpu`)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in out.splitlines()
                  if ln.startswith("Flags")), [])  # fmt: skip
    return sorted({f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")})


def gpu_name() -> str | None:
    """The first NVIDIA GPU's name (`nvidia-smi`), None where there is none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.strip().splitlines()
    return names[0].strip() if names else None
