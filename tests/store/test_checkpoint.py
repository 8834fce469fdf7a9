"""Checkpoints survive a crash at any point of a save: `latest_checkpoint` only ever finds
complete ones, also while a resumed run rewrites the step it resumed from."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rldojo.store.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint


class _Crash(Exception):
    """The process dies here (a SIGKILL, raised instead so the test can look at the files)."""


class _Model:
    def __init__(self, value: float) -> None:
        self.value = value

    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        save_file({"w": torch.full((2,), self.value)}, str(Path(path) / "model.safetensors"))


class _Tokenizer:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def _save(directory: Path, step: int, value: float) -> Path:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return save_checkpoint(
        directory, model=_Model(value), tokenizer=_Tokenizer(), optimizer=optimizer,
        scheduler=scheduler, step=step, state={"value": value},
    )  # fmt: skip


def _crash_at(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The n-th rename or file removal of a save crashes; removal goes file by file."""
    ops = itertools.count(1)
    real_rename = Path.rename

    def tick() -> None:
        if next(ops) == n:
            raise _Crash

    def rename(self: Path, target: Path) -> Path:
        tick()
        return real_rename(self, target)

    def rmtree(path: Path, ignore_errors: bool = False) -> None:
        if ignore_errors and not Path(path).exists():
            return
        for p in sorted(Path(path).rglob("*"), reverse=True):  # files before their folder
            tick()
            p.unlink() if p.is_file() else p.rmdir()
        tick()
        Path(path).rmdir()

    monkeypatch.setattr(Path, "rename", rename)
    monkeypatch.setattr(shutil, "rmtree", rmtree)


@pytest.mark.parametrize("n", range(1, 10))
def test_a_crash_while_rewriting_a_step_leaves_only_complete_checkpoints(tmp_path, monkeypatch, n):
    _save(tmp_path, 1, 1.0)
    _save(tmp_path, 2, 2.0)
    with monkeypatch.context() as m:
        _crash_at(m, n)
        try:
            _save(tmp_path, 2, 2.0)  # a run resumed from step 2 saves step 2 again
        except _Crash:
            pass
    latest = latest_checkpoint(tmp_path)
    assert latest is not None
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = load_trainer_state(latest, optimizer, scheduler)
    weights = load_file(latest / "model.safetensors")["w"]
    assert state["step"] in (1, 2)  # the old step 2, the new one, or the one before
    assert torch.equal(weights, torch.full((2,), state["value"]))
    # The next save clears what the crash left and leaves complete checkpoints only.
    _save(tmp_path, 2, 2.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001", "step_000002"]


def test_a_half_written_checkpoint_is_not_taken_and_is_removed_by_the_next_save(tmp_path):
    _save(tmp_path, 1, 1.0)
    half = tmp_path / ".tmp_step_000002_4242"  # a writer SIGKILLed mid-save
    half.mkdir()
    (half / "state.json").write_text('{"step": 2}')
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000001"
    _save(tmp_path, 2, 2.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001", "step_000002"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"
