"""Trackers kept local and apart from the user's own: W&B offline with its dirs in the
test's tmp_path, trackio in a session tmp dir, no tracker variables from the environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_CLEARED = (
    "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL", "WANDB_DIR",
    "WANDB_RUN_ID", "WANDB_NAME", "WANDB_RESUME", "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME", "TRACKIO_PROJECT", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL",
    "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID",
)  # fmt: skip


@pytest.fixture(scope="session")
def _trackio_dir(tmp_path_factory):
    """trackio reads `TRACKIO_DIR` once, when imported: set it for the whole session."""
    path = tmp_path_factory.mktemp("trackio")
    if "trackio" in sys.modules:  # imported before this fixture: it must already be a tmp dir
        path = Path(sys.modules["trackio"].utils.TRACKIO_DIR)
        assert str(path).startswith(str(tmp_path_factory.getbasetemp())), path
    old = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TRACKIO_DIR", None)
    else:
        os.environ["TRACKIO_DIR"] = old


@pytest.fixture(autouse=True)
def tracker_env(monkeypatch, tmp_path, _trackio_dir):
    """No network, nothing under ~: W&B offline with its config/cache in tmp_path."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "wandb-home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")  # no git subprocesses in the checkout
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home))
    return _trackio_dir
