"""Fixtures of the environment tests: what a built-in needs to be built at all."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def openenv_url() -> Iterator[str]:
    """An OpenEnv server for `openenv-v1` to play: rldojo's arith-v1 served by
    `rldojo.interop.openenv_server` on a free loopback port (skipped without openenv)."""
    pytest.importorskip("openenv", reason="the openenv extra: pip install 'rldojo[openenv]'")
    from rldojo.interop.openenv_server import start_env_server
    from rldojo.interop.served_episode import ServedEnvSpec

    with start_env_server(ServedEnvSpec("arith-v1")) as handle:
        yield handle.url


@pytest.fixture
def builtin_kwargs(tmp_path_factory, request) -> Callable[[str], dict]:
    """env id -> the kwargs that build that built-in small and offline in a test: the
    OpenEnv server above for openenv-v1, a six-problem file for math-v1, one small
    database for the CRM twins, a verifiers module written on verifiers' classes
    (skipped without the extra)."""

    def kwargs(env_id: str) -> dict:
        if env_id == "openenv-v1":  # it plays a server: arith-v1, served over OpenEnv
            return {"base_url": request.getfixturevalue("openenv_url"), "tasks": 4}
        if env_id == "math-v1":
            path = tmp_path_factory.mktemp("math") / "problems.jsonl"
            rows = [{"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)}
                    for i in range(6)]  # fmt: skip
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            return {"path": str(path), "test_fraction": 0.0}
        if env_id in ("crm-v1", "web-crm-v1"):
            return {"db_size": "small", "n_databases": 1}
        if env_id == "verifiers-v1":
            pytest.importorskip("verifiers", reason="the verifiers extra: make test-verifiers")
            return {"module": str(Path(__file__).parent / "verifiers_envs" / "vf_math_single.py")}
        return {}

    return kwargs
