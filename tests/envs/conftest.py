"""Fixtures of the environment tests: what a built-in needs to be built at all."""

from __future__ import annotations

from collections.abc import Iterator

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
