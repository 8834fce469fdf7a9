"""SFT on two ranks (torchrun, gloo, FSDP2) is the one-process SFT: the same gradients, the
same losses, checkpoints that resume on either world size, and a lost rank that ends the
run instead of hanging it.

The children are the real CLI under torchrun, with one observer around `clipped_step`
(the optimizer step that ends every SFT step, `tests/rank_observer.py`): it can write the
step's whole gradients (gathered from the shards) before the optimizer moves, or SIGKILL
its rank on the n-th call. Deterministic mode, one thread per rank, `tiny-random` in fp32.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rank_observer import launch, resume
from safetensors.torch import load_file

from rldojo.store.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # torchrun, two processes with the model

DEMOS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 6 * 2?", "12"),
         ("What is 9 + 9?", "18"), ("What is 1 + 1?", "2")]  # fmt: skip
SETS = ["model.name=tiny-random", "model.autocast_bf16=false", "run.epochs=3",
        "sft.batch_size=5", "optim.warmup_steps=0", "optim.micro_batch_size=2", "optim.lr=1e-3",
        "eval.tasks=0", "run.report_to=[]", "run.threads=1", "run.deterministic=true",
        "run.checkpoint_every=1"]  # fmt: skip


OBSERVED = "rldojo.training.run"  # the module whose `clipped_step` the observer wraps


def _demos(tmp: Path) -> Path:
    path = tmp / "demos.jsonl"
    rows = [{"messages": [{"role": "user", "content": q},
                          {"role": "assistant", "content": f"<answer>{a}</answer>"}],
             "tools": None, "passed": True, "task_id": f"t{i}", "env": "arith-v1"}
            for i, (q, a) in enumerate(DEMOS)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sft(tmp: Path, run: Path, ranks: int, sets: tuple[str, ...] = (),
         **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    """`rldojo sft` on `ranks` ranks (torchrun for 2) with the observer, to the end."""
    args = ["sft", "--data", str(_demos(tmp)), "--run-dir", str(run),
            *[a for s in (*SETS, *sets) for a in ("--set", s)]]  # fmt: skip
    return launch(tmp, OBSERVED, ranks, args, **env)


def _resume(run: Path, ranks: int) -> subprocess.CompletedProcess:
    return resume("sft", run, ranks)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    newest = latest_checkpoint(run / "checkpoints")
    assert newest is not None
    return load_file(newest / "model.safetensors")


def _losses(run: Path) -> list[float]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["sft/loss"] for r in records if r["kind"] == "sft"]


def test_two_ranks_make_the_gradients_and_losses_of_one(tmp_path):
    for ranks in (1, 2):
        (tmp_path / f"grads{ranks}").mkdir()
        done = _sft(tmp_path, tmp_path / f"r{ranks}", ranks,
                    DUMP_GRADS=str(tmp_path / f"grads{ranks}"))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    one = torch.load(tmp_path / "grads1" / "1.pt")  # the first step's, before it moved
    two = torch.load(tmp_path / "grads2" / "1.pt")
    assert len(one) == len(two) > 10
    for a, b in zip(one, two, strict=True):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) <= 1e-5 * max(float(a.abs().max()), 1e-12)
    l1, l2 = _losses(tmp_path / "r1"), _losses(tmp_path / "r2")
    assert len(l1) == len(l2) == 3 and l1 == pytest.approx(l2, rel=1e-6)
    summary = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["stopped"] == "steps"
    w1, w2 = _weights(tmp_path / "r1"), _weights(tmp_path / "r2")
    assert w1.keys() == w2.keys()  # the tied output layer written once, as one process does
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted one-process run, the reference of the resumed ones."""
    tmp = tmp_path_factory.mktemp("reference")
    done = _sft(tmp, tmp / "ref", 1)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "ref"


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)])
def test_a_killed_run_resumes_on_another_world_size(tmp_path, reference, first, then):
    ref = reference
    run, stamp = tmp_path / "run", tmp_path / "killed_at"
    killed = _sft(tmp_path, run, first, KILL_AT="3", KILL_RANK=str(first - 1),
                  KILLED_AT=str(stamp))  # fmt: skip
    ended = time.time()
    assert killed.returncode != 0
    assert latest_checkpoint(run / "checkpoints").name == "step_000002"  # step 3 died
    if first > 1:  # the other rank ends too (torchrun names the lost one), nothing hangs
        assert ended - float(stamp.read_text()) < 60
        said = " ".join((killed.stdout + killed.stderr).split())
        assert f"rank : {first - 1}" in said and "exitcode : -9" in said
    resumed = _resume(run, then)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["stopped"] == "steps"
    mine, theirs = _weights(run), _weights(ref)
    assert mine.keys() == theirs.keys()
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in mine) < 1e-4
    assert _losses(run) == pytest.approx(_losses(ref), rel=1e-5)


def test_sharded_checkpoint_files_resume_on_one_rank_and_export(tmp_path, reference):
    """`run.checkpoint_format = "dcp"`: each of 2 ranks writes its shards (nothing gathered);
    killed, the run resumes in one process (the shards read whole) and ends with the
    uninterrupted run's weights; `rldojo export` writes them as a plain model directory."""
    run, stamp = tmp_path / "run", tmp_path / "killed_at"
    killed = _sft(tmp_path, run, 2, ("run.checkpoint_format=dcp",), KILL_AT="3",
                  KILL_RANK="1", KILLED_AT=str(stamp))  # fmt: skip
    assert killed.returncode != 0
    saved = latest_checkpoint(run / "checkpoints")
    assert saved.name == "step_000002" and not (saved / "model.safetensors").exists()
    assert len(list((saved / "dcp").glob("*.distcp"))) == 2  # one file a rank
    resumed = _resume(run, 1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "rldojo", "export",
                           str(latest_checkpoint(run / "checkpoints")), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    mine, theirs = load_file(out / "model.safetensors"), _weights(reference)
    assert mine.keys() == theirs.keys()
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in mine) < 1e-4
    assert _losses(run) == pytest.approx(_losses(reference), rel=1e-5)


def test_fsdp_in_one_process_trains_as_one_process(tmp_path, reference):
    """`run.shard = "fsdp"` without torchrun: FSDP2 over a group of one (what gives its CPU
    offload on one GPU) makes the unsharded run's losses and weights, and writes a `dcp`
    checkpoint that loads in one process."""
    from rldojo.policy.models import load_model

    run = tmp_path / "run"
    done = _sft(tmp_path, run, 1, ("run.shard=fsdp", "run.checkpoint_format=dcp"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _losses(run) == pytest.approx(_losses(reference), rel=1e-6)
    saved = latest_checkpoint(run / "checkpoints")
    assert saved is not None and (saved / "dcp").is_dir()
    mine, theirs = load_model(str(saved))[0].state_dict(), _weights(reference)
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in theirs) < 1e-6
