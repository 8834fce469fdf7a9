"""How busy the machine is, for benchmarks that flag runs other jobs slowed down."""

from __future__ import annotations

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
