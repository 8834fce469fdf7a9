"""Distillation: train a small student towards a teacher's per-token distributions.

For small students RL is often the wrong tool: when the model rarely solves a task, most
GRPO groups carry no signal, while a teacher gives a dense target at every token. The
loss is a KL divergence per policy token, over the whole vocabulary:

    forward  KL(teacher || student) = Σ_v p_t (log p_t - log p_s)   mean-seeking; the
             classic soft-label KD (Hinton et al. 2015), usually on teacher sequences;
    reverse  KL(student || teacher) = Σ_v p_s (log p_s - log p_t)   mode-seeking; with
             student-generated sequences this is on-policy distillation (GKD, Agarwal
             et al. 2024; MiniLLM, Gu et al. 2024), which removes the train/test mismatch
             of learning only on the teacher's prefixes.

Both distributions are softened by `kd_temperature` τ and the loss is scaled by τ² so
its gradient keeps its size (Hinton et al.). Sequences are sampled each step from the
teacher (`sequences="teacher"`) or from the current student (`"student"`). Teacher and
student must share a tokenizer (e.g. the SmolLM2 family).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from rldojo.envs.registry import make_env
from rldojo.policy.models import load_model
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.engine import collect_rollouts
from rldojo.train.batch import TokenBatch, build_token_batch, completion_logits
from rldojo.train.update import clipped_step
from rldojo.types import Rollout, SamplingParams

__all__ = ["DistillConfig", "distill", "token_kl"]

Divergence = Literal["forward", "reverse"]


def token_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    divergence: Divergence = "forward",
    temperature: float = 1.0,
    chunk_size: int = 512,
) -> tuple[Tensor, Tensor]:
    """Summed KL over masked tokens, and the per-token KL (detached).

    `student_logits` [M, T, V] (with grad), `teacher_logits` [M, T, V'] (V' >= V is cut
    to V: padded vocabularies), `mask` [M, T] bool. Rows are processed `chunk_size`
    masked tokens at a time in fp32. Returns `(loss_sum [], kl [M, T])`; divide the sum
    by the token count of the whole batch. The sum includes the τ² factor; `kl` does not.
    """
    if divergence not in ("forward", "reverse"):
        raise ValueError(f"divergence must be 'forward' or 'reverse', got {divergence!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    mask = mask.bool()  # [M, T]
    vocab = student_logits.shape[-1]
    s_rows = student_logits[mask]  # [N, V]
    t_rows = teacher_logits[..., :vocab][mask].detach()  # [N, V]
    per_token = []
    for start in range(0, s_rows.shape[0], chunk_size):
        ls = torch.log_softmax(s_rows[start : start + chunk_size].float() / temperature, -1)
        lt = torch.log_softmax(t_rows[start : start + chunk_size].float() / temperature, -1)
        if divergence == "forward":
            kl = (lt.exp() * (lt - ls)).sum(-1)  # [C]
        else:
            kl = (ls.exp() * (ls - lt)).sum(-1)  # [C]
        per_token.append(kl)
    flat = torch.cat(per_token) if per_token else s_rows.new_zeros(0, dtype=torch.float32)  # [N]
    out = torch.zeros(mask.shape, dtype=torch.float32)  # [M, T]
    out[mask] = flat.detach()
    return flat.sum() * temperature**2, out


@dataclass
class DistillConfig:
    """What `rldojo distill` runs; every field has a CLI option of the same name."""

    teacher: str = "smollm2-135m-instruct"
    student: str = "tiny-random"
    env: str = "arith-v1"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    divergence: Divergence = "forward"
    sequences: Literal["teacher", "student"] = "teacher"
    """Who samples the training sequences each step (student: on-policy)."""
    steps: int = 20
    prompts_per_step: int = 8
    max_new_tokens: int = 48
    temperature: float = 1.0
    """Sampling temperature of the sequences."""
    kd_temperature: float = 1.0
    """Softening of both distributions in the loss (τ; the loss is scaled by τ²)."""
    lr: float = 1e-5
    micro_batch_size: int = 8
    grad_clip: float = 1.0
    seed: int = 0


def _check_tokenizers(teacher_tok: Any, student_tok: Any) -> None:
    if len(teacher_tok) != len(student_tok) or teacher_tok.get_vocab() != student_tok.get_vocab():
        raise ValueError(
            "teacher and student tokenizers differ; token-level distillation needs a "
            f"shared vocabulary ({len(teacher_tok)} vs {len(student_tok)} tokens)"
        )


def _train_step(
    student: Any,
    teacher: Any,
    batch: TokenBatch,
    optimizer: torch.optim.Optimizer,
    cfg: DistillConfig,
) -> dict[str, float]:
    tokens = max(int(batch.policy_mask.sum()), 1)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for start in range(0, batch.size, cfg.micro_batch_size):
        mb = batch.rows(slice(start, start + cfg.micro_batch_size))
        with torch.no_grad():
            t_logits = completion_logits(teacher, mb, share_prefix=False)  # [M, T, V']
        s_logits = completion_logits(student, mb, share_prefix=False)  # [M, T, V]
        loss_sum, _ = token_kl(
            s_logits,
            t_logits,
            mb.policy_mask,
            divergence=cfg.divergence,
            temperature=cfg.kd_temperature,
        )
        (loss_sum / tokens).backward()
        total += float(loss_sum.detach())
    grad_norm, stepped = clipped_step(optimizer, student.parameters(), cfg.grad_clip)
    return {"loss/kl": total / tokens, "optim/grad_norm": float(grad_norm), "tokens": tokens,
            "optim/nonfinite_skipped": float(not stepped)}  # fmt: skip


def _step_rollouts(
    cfg: DistillConfig,
    step: int,
    tasks: list[Any],
    policy: TransformersPolicy,
    env_factory: Callable[[], Any],
    loop: asyncio.AbstractEventLoop,
) -> list[Rollout]:
    """This step's sequences: one sample per prompt from the generating model."""
    start = step * cfg.prompts_per_step
    chosen = [tasks[(start + i) % len(tasks)] for i in range(cfg.prompts_per_step)]
    seed = cfg.seed * 1_000_003 + step
    requests = [(t, 0, seed + i) for i, t in enumerate(chosen)]
    sampling = SamplingParams(cfg.max_new_tokens, cfg.temperature, seed=seed)
    rollouts = loop.run_until_complete(collect_rollouts(env_factory, policy, requests, sampling))
    return [r for r in rollouts if r.trainable]


def distill(
    cfg: DistillConfig,
    out_dir: Path,
    *,
    teacher: tuple[Any, Any] | None = None,
    student: tuple[Any, Any] | None = None,
    log: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run `cfg.steps` distillation steps; save the student to ``out_dir/student``.

    `teacher` / `student` may be given as loaded `(model, tokenizer)` pairs (tests);
    otherwise they are loaded by name. Writes ``out_dir/metrics.jsonl`` and
    ``summary.json``; returns the summary.
    """
    torch.manual_seed(cfg.seed)
    t_model, t_tok = teacher or load_model(cfg.teacher)
    s_model, s_tok = student or load_model(cfg.student)
    _check_tokenizers(t_tok, s_tok)
    t_model.eval()
    s_model.train()
    gen_model = t_model if cfg.sequences == "teacher" else s_model
    policy = TransformersPolicy(gen_model, s_tok)
    env_factory = lambda: make_env(cfg.env, **cfg.env_kwargs)  # noqa: E731
    tasks = list(env_factory().tasks("train", seed=cfg.seed))
    random.Random(cfg.seed).shuffle(tasks)
    optimizer = torch.optim.AdamW(s_model.parameters(), lr=cfg.lr)
    out_dir.mkdir(parents=True, exist_ok=True)
    loop = asyncio.new_event_loop()
    history = []
    try:
        with (out_dir / "metrics.jsonl").open("w") as metrics_file:
            for step in range(cfg.steps):
                t0 = time.perf_counter()
                rollouts = _step_rollouts(cfg, step, tasks, policy, env_factory, loop)
                if not rollouts:
                    continue
                batch = build_token_batch(rollouts, s_tok.pad_token_id)
                metrics = _train_step(s_model, t_model, batch, optimizer, cfg)
                if cfg.sequences == "student":
                    policy.update_weights()
                metrics["time/step"] = time.perf_counter() - t0
                history.append(metrics)
                metrics_file.write(json.dumps({"step": step + 1, **metrics}) + "\n")
                if log is not None:
                    log(step + 1, metrics)
    finally:
        loop.close()
    s_model.save_pretrained(out_dir / "student", safe_serialization=True)
    s_tok.save_pretrained(out_dir / "student")
    summary = {
        "config": asdict(cfg),
        "steps": len(history),
        "kl_first": history[0]["loss/kl"] if history else None,
        "kl_last": history[-1]["loss/kl"] if history else None,
        "student_dir": str(out_dir / "student"),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
