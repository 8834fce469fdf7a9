"""GRPO on two ranks (torchrun, gloo, FSDP2) is the one-process GRPO: rank 0 rolls out and
keeps the ledger, both ranks train on their share of the same groups, and the step selects
the same forking tokens and makes the same gradients; a run killed on one world size
resumes on the other with no rollout lost or taken twice.

The children are the real CLI under torchrun with one observer around `clipped_step` (the
optimizer step that ends each mini-batch, `tests/rank_observer.py`): rank 0 writes each
call's whole gradients (gathered from the shards) before the optimizer moves, or a rank
SIGKILLs itself on the n-th call. Deterministic mode, one thread per rank, `tiny-random`
in fp32, `coin-v1` (tests/coin_env.py: a random model's groups have signal).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import torch
from rank_observer import launch, resume
from safetensors.torch import load_file

from rldojo.policy.models import load_model
from rldojo.store.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # torchrun, two processes with the model

SETS = ["model.name=tiny-random", "model.autocast_bf16=false", "env.id=coin_env:CoinEnv",
        "run.steps=3", "rollout.prompts_per_step=3", "rollout.group_size=4",
        "rollout.dynamic_sampling=false", "sampling.max_new_tokens=6", "sampling.temperature=1.0",
        "loss.rho=0.2", "optim.mini_batches=2", "optim.micro_batch_size=2", "optim.lr=1e-3",
        "optim.warmup_steps=0", "eval.tasks=0", "run.report_to=[]", "run.threads=1",
        "run.deterministic=true", "run.checkpoint_every=1"]  # fmt: skip


def _train(tmp: Path, run: Path, ranks: int, sets: tuple[str, ...] = (),
           **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    """`rldojo train` on `ranks` ranks (torchrun for 2) with the observer, to the end."""
    args = ["train", *[a for s in (*SETS, *sets) for a in ("--set", s)],
            "--set", f"run.output_dir={run.parent}", "--set", f"run.name={run.name}"]  # fmt: skip
    return launch(tmp, "rldojo.training.update", ranks, args, **env)


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    """Step `step`'s checkpoint's weight files: the model's, or under LoRA the adapters'."""
    saved = run / "checkpoints" / f"step_{step:06d}"
    adapter = saved / "adapter_model.safetensors"
    return load_file(adapter if adapter.exists() else saved / "model.safetensors")


def _ledger(run: Path) -> list[tuple]:
    """Every rollout: its step, task, sample, tokens, reward, the step that trained on it,
    its advantage and the positions the mask selected."""
    with sqlite3.connect(run / "ledger.sqlite") as db:
        return db.execute(
            "SELECT step, task_id, sample_index, completion_ids, score_value, trained, "
            "advantage, selected FROM rollouts ORDER BY step, task_id, sample_index"
        ).fetchall()


def _close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    return float((a - b).abs().max()) <= rel * max(float(a.abs().max()), 1e-12)


def _step_metrics(run: Path) -> dict:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if r["kind"] == "train")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The 3-step run on 1 rank (`r1`) and on 2 (`r2`), each optimizer step's gradients
    kept (`grads1/`, `grads2/`): the pair the equivalence test compares, and the runs the
    killed ones must end like."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    for ranks in (1, 2):
        (tmp / f"grads{ranks}").mkdir()
        done = _train(tmp, tmp / f"r{ranks}", ranks, DUMP_GRADS=str(tmp / f"grads{ranks}"))
        assert done.returncode == 0, done.stderr[-3000:]
    return tmp


def _same_first_step(tmp: Path, lora: bool = False) -> None:
    """`tmp/r1` and `tmp/r2` took the same first step: its rollouts, rewards and selected
    positions, its metrics, each mini-batch's reduced gradients (the 1st before any
    optimizer step, 1e-5; the 2nd after one AdamW step on weights that agree to float
    noise, 1e-3), its checkpoint's weights (2e-4 at most, 1e-5 but for a few elements)."""
    one, two = ([r for r in _ledger(tmp / f"r{n}") if r[0] == 0] for n in (1, 2))
    assert len(one) == 3 * 4  # prompts x samples, none twice
    trained = [row for row in one if row[5]]
    assert trained and any(json.loads(row[7]) for row in trained)  # selections recorded
    assert [r[:6] + r[7:] for r in one] == [r[:6] + r[7:] for r in two]  # same positions
    assert [r[6] is None for r in one] == [r[6] is None for r in two]
    trained_adv = [(a[6], b[6]) for a, b in zip(one, two, strict=True) if a[6] is not None]
    assert [a for a, _ in trained_adv] == pytest.approx([b for _, b in trained_adv], rel=1e-6)
    m1, m2 = _step_metrics(tmp / "r1"), _step_metrics(tmp / "r2")
    assert m1["entropy/tokens_selected"] == m2["entropy/tokens_selected"] > 0
    for key in ("entropy/mean", "entropy/p80", "loss/policy", "loss/tokens", "optim/grad_norm"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-6), key  # losses near 0
    for call, rel in (("1.pt", 1e-5), ("2.pt", 1e-3)):
        g1, g2 = torch.load(tmp / "grads1" / call), torch.load(tmp / "grads2" / call)
        assert [g is None for g in g1] == [g is None for g in g2]  # frozen: none (LoRA's base)
        g1, g2 = [g for g in g1 if g is not None], [g for g in g2 if g is not None]
        assert len(g1) == len(g2) > 10 and any(float(g.abs().max()) > 0 for g in g1)
        assert all(a.shape == b.shape and _close(a, b, rel) for a, b in zip(g1, g2, strict=True))
    w1, w2 = (_weights(tmp / f"r{n}", 1) for n in (1, 2))
    assert w1.keys() == w2.keys()  # the tied output layer written once, as one process does
    assert all(("lora_" in k) == lora for k in w1)  # under LoRA the adapters alone
    # AdamW scales each element's step by its own gradient history, so an element whose
    # gradient is float noise moves by up to lr (1e-3) either way: on an AVX-512 EPYC one
    # of 3.2M moved 1.16e-4 apart (mean 8e-9). Bound those few, and how many they are.
    diffs = torch.cat([(w1[k] - w2[k]).abs().flatten() for k in w1])
    assert float(diffs.max()) < 2e-4 and float((diffs > 1e-5).float().mean()) < 1e-5


def test_two_ranks_select_the_tokens_and_make_the_gradients_of_one(uninterrupted):
    """From the same weights, 2 ranks take the 1-rank step (the mask from the rollouts'
    own entropies); later steps sample from weights that differ by summation order, so
    only their count is compared."""
    _same_first_step(uninterrupted)
    for run in ("r1", "r2"):
        summary = json.loads((uninterrupted / run / "summary.json").read_text())
        assert summary["steps"] == 3 and summary["stopped"] == "steps"
        assert summary["rollouts"] == 36
    assert len(list((uninterrupted / "grads2").iterdir())) == 6  # 3 steps x 2 mini-batches


def test_trainer_entropies_and_lora_adapters_cross_ranks(tmp_path):
    """`loss.entropy_source = "trainer"`: each rank computes its rows' entropies and they
    are summed across ranks (rho 1, so the check is on the entropies, not on float ties at
    the top-rho threshold); with LoRA adapters on the sharded base (their gradients; rank
    0's sampler gets the gathered adapters, the checkpoint holds them alone)."""
    sets = ("run.steps=1", "loss.entropy_source=trainer", "loss.rho=1.0",
            "model.lora={r=4,alpha=8}")  # fmt: skip
    for ranks in (1, 2):
        (tmp_path / f"grads{ranks}").mkdir()
        done = _train(tmp_path, tmp_path / f"r{ranks}", ranks, sets,
                      DUMP_GRADS=str(tmp_path / f"grads{ranks}"))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    _same_first_step(tmp_path, lora=True)


def _step_weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    """A checkpoint's weights as a model loads them (whole files, or each rank's shards)."""
    model, _ = load_model(str(run / "checkpoints" / f"step_{step:06d}"))
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("first", "then", "files"), [(2, 1, "hf"), (1, 2, "dcp")])
def test_a_killed_run_resumes_on_another_world_size(tmp_path, uninterrupted, first, then, files):
    """Killed in step 2 (its rollouts are in the ledger, its update is not), resumed on the
    other world size: step 2 trains on those rollouts (none sampled again, none lost) with
    the restored optimizer state, as the uninterrupted run on the first world size did.
    `files`: the checkpoint format (`dcp`: torch.distributed.checkpoint shards, resharded
    to the new world size on resume)."""
    ref, run, stamp = uninterrupted / f"r{first}", tmp_path / "run", tmp_path / "killed_at"
    fmt = (f"run.checkpoint_format={files}",)
    # Call 3 is step 2's first mini-batch; with two ranks, the rank that does not write dies.
    killed = _train(tmp_path, run, first, fmt, KILL_AT="3", KILL_RANK=str(first - 1),
                    KILLED_AT=str(stamp))  # fmt: skip
    ended = time.time()
    assert killed.returncode != 0
    assert latest_checkpoint(run / "checkpoints").name == "step_000001"
    if first > 1:  # the other rank ends too (torchrun names the lost one), nothing hangs
        assert ended - float(stamp.read_text()) < 60
        said = " ".join((killed.stdout + killed.stderr).split())
        assert f"rank : {first - 1}" in said and "exitcode : -9" in said
    before = _ledger(run)
    assert len(before) == 24  # steps 1 and 2 sampled, step 2 not trained
    resumed = resume("train", run, then)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "reused 12 rollouts from the ledger" in resumed.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["stopped"] == "steps"
    after = _ledger(run)
    assert len(after) == 36 == len({r[:3] for r in after})  # 0 lost, 0 twice
    assert [r[:5] for r in after[:24]] == [r[:5] for r in before]  # step 2's, reused
    assert [r[:5] for r in after[:24]] == [r[:5] for r in _ledger(ref)[:24]]
    newest = latest_checkpoint(run / "checkpoints")
    assert (newest / "dcp").is_dir() == (files == "dcp")
    assert (newest / "model.safetensors").exists() == (files == "hf")
    if files == "dcp":  # written by both ranks of the resumed run
        assert len(list((newest / "dcp").glob("*.distcp"))) == then
    # Step 2's update on the other world size: the weights of the uninterrupted run.
    mine, theirs = _step_weights(run, 2), _step_weights(ref, 2)
    assert mine.keys() == theirs.keys()
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in mine) < 1e-4
