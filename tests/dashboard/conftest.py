"""The dashboard over synthetic run directories, served on loopback for the module."""

from __future__ import annotations

import httpx
import pytest
from dashboard.runs_fixture import make_runs


@pytest.fixture(scope="package")
def served(tmp_path_factory, tiny):
    """(handle, row ids, runs root): the real app in a uvicorn thread on a free port."""
    from rldojo.dashboard import start_dashboard

    _, tokenizer = tiny
    root = tmp_path_factory.mktemp("runs")
    ids = make_runs(root, tokenizer)
    with start_dashboard([root]) as handle:
        yield handle, ids, root


@pytest.fixture
def client(served):
    handle, _, _ = served
    with httpx.Client(base_url=handle.url, timeout=30) as c:
        yield c
