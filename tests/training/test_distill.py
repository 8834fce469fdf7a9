"""Distillation: the KL loss against references, and a tiny run that moves the student."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch
import torch.nn.functional as F

from rldojo.config import load_config
from rldojo.envs.registry import make_env
from rldojo.policy.models import load_model
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts
from rldojo.training.batch import build_token_batch, completion_logits
from rldojo.training.distill import run_distill, token_kl
from rldojo.types import SamplingParams

pytestmark = pytest.mark.slow  # loads tiny-random or starts the CLI


def test_token_kl_matches_torch_kl_div_in_both_directions():
    torch.manual_seed(0)
    s = torch.randn(2, 3, 7, requires_grad=True)  # [M, T, V]
    t = torch.randn(2, 3, 9)  # a padded teacher vocabulary: cut to 7
    mask = torch.tensor([[True, True, False], [True, False, False]])
    ls, lt = F.log_softmax(s[mask], -1), F.log_softmax(t[..., :7][mask], -1)
    forward = F.kl_div(ls, lt, log_target=True, reduction="sum")  # KL(teacher || student)
    reverse = F.kl_div(lt, ls, log_target=True, reduction="sum")  # KL(student || teacher)
    loss, per_token = token_kl(s, t, mask, divergence="forward", chunk_size=2)
    assert loss.item() == pytest.approx(forward.item(), rel=1e-5)
    assert per_token[~mask].abs().sum() == 0 and per_token.sum().item() == pytest.approx(
        loss.item()
    )
    loss_r, _ = token_kl(s, t, mask, divergence="reverse")
    assert loss_r.item() == pytest.approx(reverse.item(), rel=1e-5)
    loss.backward()
    assert s.grad is not None and s.grad[~mask].abs().sum() == 0
    hot, _ = token_kl(s, t, mask, temperature=2.0)
    ls2, lt2 = F.log_softmax(s[mask] / 2, -1), F.log_softmax(t[..., :7][mask] / 2, -1)
    assert hot.item() == pytest.approx(
        4 * F.kl_div(ls2, lt2, log_target=True, reduction="sum").item(), rel=1e-5
    )
    same, _ = token_kl(t[..., :7], t, mask)
    assert same.item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        token_kl(s, t, mask, divergence="sideways")  # type: ignore[arg-type]


def _held_out_kl(student, teacher, batch) -> float:
    with torch.no_grad():
        s = completion_logits(student, batch, share_prefix=False)
        t = completion_logits(teacher, batch, share_prefix=False)
        loss, _ = token_kl(s, t, batch.policy_mask)
    return loss.item() / int(batch.policy_mask.sum())


@pytest.mark.parametrize(
    ("divergence", "sequences"), [("forward", "teacher"), ("reverse", "student")]
)
def test_distill_moves_the_student_towards_the_teacher(tiny, tmp_path, divergence, sequences):
    teacher, tokenizer = tiny
    student = copy.deepcopy(teacher)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    held = asyncio.run(
        collect_rollouts(
            lambda: make_env("arith-v1"),
            TransformersPolicy(teacher, tokenizer, generation_dtype=None),
            [(t, 0, i) for i, t in enumerate(make_env("arith-v1").tasks("test", n=3))],
            SamplingParams(max_new_tokens=6, seed=5),
        )
    )
    batch = build_token_batch(held, tokenizer.pad_token_id)
    before = _held_out_kl(student, teacher, batch)
    for name, model in (("teacher", teacher), ("student", student)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    cfg = load_config(None, [
        f"model.name={tmp_path / 'student'}", "model.autocast_bf16=false", "env.id=arith-v1",
        f"distill.teacher={tmp_path / 'teacher'}", f"distill.divergence={divergence}",
        f"distill.sequences={sequences}", "run.steps=3", "distill.batch_size=3",
        "sampling.max_new_tokens=6", "sampling.temperature=1.0", "optim.lr=3e-3",
        "optim.warmup_steps=0", "optim.schedule=constant", "optim.micro_batch_size=2",
        "eval.tasks=0", "run.report_to=[]", "run.threads=1",
    ])  # fmt: skip
    summary = run_distill(cfg, run_dir=tmp_path / "run")
    trained, _ = load_model(summary["checkpoint"])
    assert _held_out_kl(trained, teacher, batch) < 0.7 * before
    assert summary["steps"] == 3 and summary["kl_last"] < summary["kl_first"]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    assert summary["stopped"] == "steps" and summary["divergence"] == divergence
