"""The capability probe and the fail-closed policy."""

from __future__ import annotations

import os

import pytest

from rldojo.sandbox import ProbeResult, SandboxPool, SandboxUnavailable, probe

pytestmark = pytest.mark.slow  # probes bubblewrap: processes


def test_probe_reports_every_layer() -> None:
    result = probe()
    assert isinstance(result, ProbeResult)
    layers = result.layers()
    for name in ("bwrap", "uid_dropped", "no_capabilities", "seccomp", "pid_namespace"):
        assert name in layers
        assert f"] {name.replace('_', ' ')}" in result.summary
    assert result.mode in ("strict", "weak", "unavailable")


def test_strict_mode_on_this_machine(strict: None) -> None:
    result = probe()
    assert all(ok for name, ok in result.layers().items() if name not in result.OPTIONAL)
    assert result.summary.startswith("sandbox: strict")


def test_missing_interpreter_fails_closed() -> None:
    result = probe("/nonexistent/python3")
    assert result.mode == "unavailable" and not result.strict
    assert result.problems
    with pytest.raises(SandboxUnavailable):
        SandboxPool(1, python="/nonexistent/python3")


def test_weak_mode_needs_explicit_consent(strict: None, monkeypatch: pytest.MonkeyPatch) -> None:
    weak = ProbeResult(**{**probe().__dict__, "seccomp": False})
    monkeypatch.setattr("rldojo.sandbox.pool.probe", lambda python: weak)
    monkeypatch.delenv("RLDOJO_SANDBOX_ALLOW_WEAK", raising=False)
    with pytest.raises(SandboxUnavailable, match="weaker mode"):
        SandboxPool(1)
    with SandboxPool(1, allow_weak=True) as pool:
        assert pool.run("print(6 * 7)").stdout == "42\n"


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only")
def test_ci_requires_strict() -> None:
    assert probe().strict, probe().summary
