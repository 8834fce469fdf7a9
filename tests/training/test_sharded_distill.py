"""Distillation on two ranks (torchrun, gloo, FSDP2) is the one-process distillation: rank
0 samples the sequences from its whole copy of the student, both ranks train on their
share with the teacher sharded too, and the step's reduced gradients are the one-process
ones; the sampler's copy follows the gathered weights (`tests/rank_observer.py` observes
the optimizer step). Deterministic mode, one thread per rank, fp32 tiny models."""

from __future__ import annotations

import json

import pytest
import torch
from rank_observer import launch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # torchrun, two processes with two models


def test_two_ranks_make_the_gradients_of_one(tmp_path, nudged_student):
    sets = [f"model.name={nudged_student}", "model.autocast_bf16=false",
            "distill.teacher=tiny-random", "distill.sequences=student",
            "distill.divergence=reverse", "run.steps=2", "distill.batch_size=3",
            "sampling.max_new_tokens=4", "optim.micro_batch_size=2", "optim.lr=1e-3",
            "run.deterministic=true", "run.threads=1", "run.checkpoint_every=1",
            "run.report_to=[]", "eval.tasks=0"]  # fmt: skip
    for ranks in (1, 2):
        (tmp_path / f"grads{ranks}").mkdir()
        args = ["distill", *[a for s in sets for a in ("--set", s)],
                "--out", str(tmp_path / f"r{ranks}")]  # fmt: skip
        done = launch(tmp_path, "rldojo.training.run", ranks, args,
                      DUMP_GRADS=str(tmp_path / f"grads{ranks}"))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    g1, g2 = torch.load(tmp_path / "grads1" / "1.pt"), torch.load(tmp_path / "grads2" / "1.pt")
    assert len(g1) == len(g2) > 10 and any(float(g.abs().max()) > 0 for g in g1)
    for a, b in zip(g1, g2, strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * max(float(a.abs().max()), 1e-12)
    records = [[json.loads(x) for x in (tmp_path / f"r{r}" / "metrics.jsonl").read_text()
                .splitlines()] for r in (1, 2)]  # fmt: skip
    first = [next(m for m in rs if m["kind"] == "distill") for rs in records]
    assert first[1]["loss/kl"] == pytest.approx(first[0]["loss/kl"], rel=1e-5)
    assert first[1]["tokens"] == first[0]["tokens"] > 0
    # Step 1's checkpoint: the whole weights, tied output layer once, as one process saves.
    w1, w2 = (load_file(tmp_path / f"r{r}" / "checkpoints" / "step_000001" /
                        "model.safetensors") for r in (1, 2))  # fmt: skip
    assert w1.keys() == w2.keys()
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4
    summary = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped"] == "steps"  # step 2 sampled from
    # the gathered weights
