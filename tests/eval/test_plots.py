"""Every report plot writes a PNG file."""

from __future__ import annotations

import numpy as np
import pytest

from rldojo.eval import plots

pytestmark = pytest.mark.slow  # matplotlib renders PNGs

PNG = b"\x89PNG"


def test_plots_write_pngs(tmp_path):
    rng = np.random.default_rng(0)
    values = np.concatenate([np.zeros(50), rng.exponential(1.0, 200)])
    files = [
        plots.entropy_histogram({"base": values, "trained": values * 0.5}, tmp_path / "h.png"),
        plots.sequence_entropy(
            ["The", " answer", " is", "\n", "42"],
            [0.1, 2.0, 0.0, 1.5, 0.3],
            [False, True, False, True, False],
            tmp_path / "s.png",
            threshold=1.5,
        ),
        plots.entropy_change(
            [
                {"bucket": "0-50%", "mean_base": 0.1, "mean_new": 0.2},
                {"bucket": "50-100%", "mean_base": 2.0, "mean_new": 1.5},
            ],
            tmp_path / "c.png",
            labels=("base", "trained"),
        ),
        plots.pass_rate_histogram([0.0, 0.25, 0.5, 1.0], tmp_path / "sub" / "p.png", band=(0, 1)),
        plots.robustness(
            {
                "baseline": {"accuracy": 0.5, "ci95": [0.4, 0.6]},
                "labels=numbers": {"accuracy": 0.3, "ci95": [0.2, 0.4]},
            },
            tmp_path / "r.png",
        ),
    ]
    for path in files:
        assert path.read_bytes()[:4] == PNG and path.stat().st_size > 1000
