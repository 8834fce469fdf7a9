"""Precision chosen by measurement: the pure decision, the explicit overrides, the cache."""

from __future__ import annotations

import json

import pytest
import torch

from rldojo.hardware import precision as hp
from rldojo.hardware.precision import MatmulProbe, choose, resolve_precision

AVX2 = MatmulProbe(fp32=54.3, bf16=1.3)  # measured on an AVX2-only EPYC
BF16_UNITS = MatmulProbe(fp32=60.0, bf16=130.0)  # a CPU with AVX-512 bf16 units


def test_avx2_without_bf16_units_picks_fp32() -> None:
    dtype, reason = choose("cpu", "AVX2", AVX2)
    assert dtype == "float32"
    assert "0.02x" in reason and "AVX2" in reason


def test_bf16_units_pick_bf16_only_when_clearly_faster() -> None:
    assert choose("cpu", "AVX512", BF16_UNITS)[0] == "bfloat16"
    tie = MatmulProbe(fp32=60.0, bf16=60.0 * (hp.BF16_MIN_SPEEDUP - 0.01))
    assert choose("cpu", "AVX512", tie)[0] == "float32"


def test_cuda_is_bf16_without_a_probe_and_no_probe_is_fp32() -> None:
    assert choose("cuda:0", "NVIDIA H200", None)[0] == "bfloat16"
    assert choose("cpu", "AVX2", None)[0] == "float32"


def test_auto_resolves_both_values_from_one_probe() -> None:
    calls: list[int] = []

    def probe() -> MatmulProbe:
        calls.append(1)
        return BF16_UNITS

    p = resolve_precision(probe=probe)
    assert (p.generation_dtype, p.autocast_bf16, p.probe) == ("bfloat16", True, BF16_UNITS)
    assert p.torch_generation_dtype() is torch.bfloat16 and calls == [1]
    slow = resolve_precision(probe=lambda: AVX2)
    assert (slow.generation_dtype, slow.autocast_bf16) == ("float32", False)
    assert slow.torch_generation_dtype() is torch.float32
    assert slow.as_dict()["probe_gflops"] == {"fp32": 54.3, "bf16": 1.3}


def test_explicit_values_win_and_skip_the_probe() -> None:
    def never() -> MatmulProbe:
        raise AssertionError("probed although nothing was auto")

    p = resolve_precision("bfloat16", False, probe=never)
    assert (p.generation_dtype, p.autocast_bf16, p.probe) == ("bfloat16", False, None)
    assert p.reason == "set explicitly in the config"
    mixed = resolve_precision("float32", "auto", probe=lambda: BF16_UNITS)
    assert (mixed.generation_dtype, mixed.autocast_bf16) == ("float32", True)
    assert "other value set explicitly" in mixed.reason


def test_probe_is_cached_per_machine(tmp_path, monkeypatch) -> None:
    path = tmp_path / "precision.json"
    calls: list[int] = []

    def measure() -> MatmulProbe:
        calls.append(1)
        return AVX2

    assert hp.cached_probe(path, measure) == AVX2
    assert hp.cached_probe(path, measure) == AVX2
    assert calls == [1]  # the second read came from the file
    (entry,) = json.loads(path.read_text()).values()
    assert (entry["fp32"], entry["bf16"]) == (54.3, 1.3)
    assert (entry["cpu_flags"], entry["torch"]) == (hp.cpu_flags(), torch.__version__)
    monkeypatch.setattr(hp, "machine_key", lambda: "another machine")
    assert hp.cached_probe(path, lambda: BF16_UNITS) == BF16_UNITS  # a new key measures
    assert len(json.loads(path.read_text())) == 2


def test_corrupt_cache_is_measured_again(tmp_path) -> None:
    path = tmp_path / "precision.json"
    path.write_text("{not json")
    assert hp.cached_probe(path, lambda: AVX2) == AVX2
    assert json.loads(path.read_text())[hp.machine_key()]["fp32"] == 54.3


NOW = 1_700_000_000.0  # the clock `cached_probe` is given: no test reads the real one


def _entry(**changes) -> dict:
    """A cache entry for this machine, measured a day before `NOW`, with `changes`."""
    entry = {"fp32": 54.3, "bf16": 1.3, "measured_at": NOW - 86400.0,
             "cpu_flags": hp.cpu_flags(), "torch": torch.__version__}  # fmt: skip
    return entry | changes


@pytest.mark.parametrize(
    "changes",
    [
        {"cpu_flags": "0123456789abcdef"},  # same model name, other vector units
        {"torch": "1.0.0"},  # other kernels
        {"measured_at": NOW - hp.PROBE_MAX_AGE_S - 1.0},  # too old
        {"measured_at": NOW + 86400.0},  # dated in the future: not trusted
        {"measured_at": None},  # written before entries were dated
    ],
    ids=["flags", "torch", "old", "future", "undated"],
)
def test_a_stale_cache_entry_is_measured_again(tmp_path, changes) -> None:
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({hp.machine_key(): _entry(**changes)}))
    calls: list[int] = []

    def measure() -> MatmulProbe:
        calls.append(1)
        return BF16_UNITS

    assert hp.cached_probe(path, measure, now=NOW) == BF16_UNITS
    assert calls == [1]
    entry = json.loads(path.read_text())[hp.machine_key()]  # replaced, freshly dated
    assert (entry["fp32"], entry["bf16"], entry["measured_at"]) == (60.0, 130.0, NOW)
    assert (entry["cpu_flags"], entry["torch"]) == (hp.cpu_flags(), torch.__version__)
    assert hp.cached_probe(path, measure, now=NOW + 60.0) == BF16_UNITS
    assert calls == [1]  # the new entry is reused


def test_a_fresh_cache_entry_is_reused_until_refresh(tmp_path) -> None:
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({hp.machine_key(): _entry()}))
    calls: list[int] = []

    def measure() -> MatmulProbe:
        calls.append(1)
        return BF16_UNITS

    almost = NOW - 86400.0 + hp.PROBE_MAX_AGE_S  # the last moment it is still fresh
    assert hp.cached_probe(path, measure, now=NOW) == AVX2
    assert hp.cached_probe(path, measure, now=almost) == AVX2
    assert calls == []
    assert hp.cached_probe(path, measure, now=NOW, refresh=True) == BF16_UNITS
    assert calls == [1]
    assert json.loads(path.read_text())[hp.machine_key()]["bf16"] == 130.0


def test_cpu_flags_digest_follows_the_flags_line(monkeypatch) -> None:
    def cpuinfo(flags: str):
        return lambda: ["processor\t: 0", "model name\t: Some CPU", f"flags\t\t: {flags}"]

    monkeypatch.setattr(hp, "_cpuinfo", cpuinfo("fpu avx2 avx512f"))
    digest = hp.cpu_flags()
    monkeypatch.setattr(hp, "_cpuinfo", cpuinfo("avx512f fpu avx2"))  # order is not a change
    assert hp.cpu_flags() == digest
    monkeypatch.setattr(hp, "_cpuinfo", cpuinfo("fpu avx2 avx512f avx512_bf16"))
    assert hp.cpu_flags() != digest
    monkeypatch.setattr(hp, "_cpuinfo", lambda: [])
    assert hp.cpu_flags() == "unknown"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_measure_matmul_reports_a_positive_rate(dtype: torch.dtype) -> None:
    assert hp.measure_matmul(dtype, seconds=0.01) > 0
