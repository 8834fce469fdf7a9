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

`run_distill(config)` is what `rldojo distill` calls: the objective `DistillObjective` in
the run loop of `rldojo train` (`rldojo.training.loop`), so distillation has the run
directory, resume, checkpoints, LoRA (`model.lora`), precision, budgets, interrupts,
evaluations and callbacks RL has. The student is `[model]`, the teacher and the loss
`[distill]` (`rldojo.config.distill`); prompts from `[env]`'s train tasks, shuffled with
`run.seed`, `distill.batch_size` a step, one sample each.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import torch
from rich.console import Console
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from rldojo.config import TrainConfig
from rldojo.config.stages import for_objective
from rldojo.policy.base import Policy, Tokenizer
from rldojo.policy.models import check_model
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import collect_rollouts
from rldojo.training.batch import TokenBatch, build_token_batch, completion_logits
from rldojo.training.callbacks import Callback
from rldojo.training.distributed import rank_micro_batches
from rldojo.training.loop import new_run_dir, run_loop, with_console
from rldojo.training.run import Run
from rldojo.training.stops import RunStopped
from rldojo.training.update import forward_context
from rldojo.types import Rollout

__all__ = ["DistillObjective", "run_distill", "token_kl"]

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
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # [M, T]
    out[mask] = flat.detach()
    return flat.sum() * temperature**2, out


def _check_tokenizers(teacher_tok: Tokenizer, student_tok: Tokenizer) -> None:
    vocab = [cast(PreTrainedTokenizerBase, t).get_vocab() for t in (teacher_tok, student_tok)]
    if len(teacher_tok) != len(student_tok) or vocab[0] != vocab[1]:
        raise ValueError(
            "teacher and student tokenizers differ; token-level distillation needs a "
            f"shared vocabulary ({len(teacher_tok)} vs {len(student_tok)} tokens)"
        )


def run_distill(
    config: TrainConfig,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: Sequence[Callback] = (),
    console: Console | None = None,
) -> dict[str, Any]:
    """Distil `distill.teacher` into `config.model`; returns the summary (also written to
    RUN/summary.json). The run directory rules, interrupts and resume are the run loop's
    (`rldojo.training.loop.run_loop`)."""
    run_dir = run_dir or new_run_dir(config)
    config = for_objective(config, "distill")  # [distill.optim] etc. over the shared ones
    return run_loop(
        lambda d: DistillObjective(Run(config, run_dir, resume=resume, dist=d)),
        config,
        run_dir,
        command="distill",
        resume=resume,
        overwrite=overwrite,
        callbacks=with_console(callbacks, console),
    )


class DistillObjective:
    """Token KL towards the teacher on sequences the teacher or the student samples."""

    command = "distill"
    kind = "distill"
    summary_keys = (
        "model",
        "teacher",
        "env",
        "steps",
        "kl_first",
        "kl_last",
        "accuracy_before",
        "accuracy_after",
        "checkpoint",
        "wall_s",
    )

    def __init__(self, run: Run) -> None:
        """Sharded, rank 0 samples the sequences (from whole copies of the generating
        model) and every rank trains on its share of them."""
        cfg, d = run.config, run.config.distill
        self.run, self.config = run, cfg
        assert run.mixture is not None and run.grader is not None  # Run(tasks=True)
        self.mixture = run.mixture
        check_model(d.teacher)
        run.load(sampler=True)
        teacher_sequences = d.sequences == "teacher"
        self.teacher, teacher_tok, whole = run.frozen(d.teacher, whole_copy=teacher_sequences)
        _check_tokenizers(teacher_tok, run.tokenizer)
        self.sampler: Policy | None = run.policy  # the student's, on rank 0
        if teacher_sequences and whole is not None:
            gen_dtype = run.precision.torch_generation_dtype()
            self.sampler = TransformersPolicy(whole, run.tokenizer, generation_dtype=gen_dtype)
        self.tasks = [t for slot in self.mixture.slots.values() for t in slot.train_tasks]
        random.Random(cfg.run.seed).shuffle(self.tasks)
        self.total_steps = cfg.run.steps
        self.kl_first: float | None = None
        self.kl_last: float | None = None
        self.over_budget: RunStopped | None = None
        run.start(self)

    def header(self) -> list[str]:
        d, run = self.config.distill, self.run
        return [
            f"[bold]rldojo distill[/] {d.teacher} -> {self.config.model.name} on "
            f"{self.config.env.id} ({d.divergence} KL, {d.sequences} sequences) -> {run.run_dir}",
            f"precision: {run.precision.describe()}",
            f"threads: {run.threads.describe()}",
        ]

    def preflight(self) -> RunStopped | None:
        return None

    def _rollouts(self) -> list[Rollout]:
        """This step's sequences: one sample per prompt from the generating model."""
        cfg, n, step = self.config, self.config.distill.batch_size, self.run.step_num
        chosen = [self.tasks[(step * n + i) % len(self.tasks)] for i in range(n)]
        seed = cfg.run.seed * 1_000_003 + step
        requests = [(t, 0, seed + i) for i, t in enumerate(chosen)]
        ro = cfg.rollout
        assert self.sampler is not None  # rank 0's
        rollouts = self.run.loop.run_until_complete(
            collect_rollouts(
                self.mixture.make_env_for,
                self.sampler,
                requests,
                self.run.sampling(seed),
                env_timeout_s=ro.env_timeout_s,
                max_turns=ro.max_turns,
                max_episode_tokens=ro.max_episode_tokens,
            )
        )
        return [r for r in rollouts if r.trainable]

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        run = self.run
        rollouts = run.dist.broadcast(self._rollouts() if run.dist.main else [])
        metrics: dict[str, Any] = {"distill/sequences": len(rollouts), "optim/lr": run.lr()}
        if rollouts:
            batch = build_token_batch(rollouts, run.pad_id)
            metrics |= self._train_on(batch)
            self.kl_first = metrics["loss/kl"] if self.kl_first is None else self.kl_first
            self.kl_last = metrics["loss/kl"]
            if self.config.distill.sequences == "student":
                run.publish()  # the next step samples from the trained student
        else:
            metrics["train/skipped"] = 1  # no episode produced a sequence to train on
        metrics["time/step"] = time.perf_counter() - t0
        return metrics

    def _train_on(self, batch: TokenBatch) -> dict[str, Any]:
        """The KL over this rank's micro-batches (all of them in one process), over the
        whole batch's token count; one optimizer step."""
        run, d = self.run, self.config.distill
        tokens = max(int(batch.policy_mask.sum()), 1)
        batch = batch.to(run.device)
        autocast = partial(forward_context, self.config, run.model, run.device)
        size = self.config.optim.micro_batch_size
        step = [list(range(k, min(k + size, batch.size))) for k in range(0, batch.size, size)]
        mine, padding = rank_micro_batches(step, run.dist, size)
        total = 0.0
        for k, rows in enumerate(mine):
            mb, weight = batch.rows(rows), 0.0 if k >= len(mine) - padding else 1.0
            with torch.no_grad(), autocast():
                t_logits = completion_logits(self.teacher, mb, share_prefix=False)  # [M, T, V']
            with autocast():
                s_logits = completion_logits(run.model, mb, share_prefix=False)  # [M, T, V]
            loss_sum, _ = token_kl(
                s_logits,
                t_logits,
                mb.policy_mask,
                divergence=d.divergence,
                temperature=d.kd_temperature,
            )
            scale = weight * run.dist.world  # the sharded model averages the ranks' gradients
            (loss_sum / tokens if scale == 1.0 else scale * loss_sum / tokens).backward()
            total += weight * float(loss_sum.detach())
        total = run.dist.sum(total)
        grad_norm, stepped = run.optimizer_step()
        return {
            "loss/kl": total / tokens,
            "optim/grad_norm": grad_norm,
            "tokens": tokens,
            "optim/nonfinite_skipped": float(not stepped),
        }

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        return []

    def step_line(self, step: int, m: dict[str, Any]) -> str:
        if "loss/kl" not in m:
            return f"step {step:>3} no sequence to train on (every episode failed)"
        return (
            f"step {step:>3} KL/token {m['loss/kl']:.4f} tokens {m['tokens']} "
            f"grad {m['optim/grad_norm']:.2f} {m['time/step']:.1f}s"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"distill": True, "kl_first": self.kl_first, "kl_last": self.kl_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_first, self.kl_last = state.get("kl_first"), state.get("kl_last")

    def summary(self) -> dict[str, Any]:
        d = self.config.distill
        return {
            "model": self.config.model.name,
            "teacher": d.teacher,
            "env": self.config.env.id,
            "divergence": d.divergence,
            "sequences": d.sequences,
            "kl_first": self.kl_first,
            "kl_last": self.kl_last,
            "precision": self.run.precision.as_dict(),
        }

    def close(self) -> None:
        pass
