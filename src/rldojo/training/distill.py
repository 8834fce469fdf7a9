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
`run.seed`, `rollout.prompts_per_step` a step, one sample each.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console
from torch import Tensor

from rldojo.config import TrainConfig, dump_config
from rldojo.eval.harness import EvalResult
from rldojo.policy import models
from rldojo.policy.lora import trainable_parameters
from rldojo.policy.training_model import check_training_model, load_training_model, make_policy
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.rollout.episodes import TurnProgress, collect_rollouts
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.store.files import write_atomically
from rldojo.training.batch import TokenBatch, build_token_batch, completion_logits
from rldojo.training.callbacks import Callback
from rldojo.training.distributed import (
    Dist,
    check_shardable,
    gather_into,
    rank_device,
    rank_micro_batches,
    shard_model,
)
from rldojo.training.heldout import eval_record, heldout_eval, heldout_tasks
from rldojo.training.loop import new_run_dir, run_loop, with_console
from rldojo.training.preflight import build_mixture, pass_threshold
from rldojo.training.rank_checkpoints import restore_trainer_state, save_on_ranks
from rldojo.training.resources import resolve_resources, seed_everything
from rldojo.training.stops import RunStopped
from rldojo.training.update import adamw_with_schedule, clipped_step, forward_context
from rldojo.types import Rollout, SamplingParams

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


def _check_tokenizers(teacher_tok: Any, student_tok: Any) -> None:
    if len(teacher_tok) != len(student_tok) or teacher_tok.get_vocab() != student_tok.get_vocab():
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
    return run_loop(
        lambda d: DistillObjective(config, run_dir, resume=resume, dist=d), config, run_dir,
        command="distill", resume=resume, overwrite=overwrite,
        callbacks=with_console(callbacks, console),
    )  # fmt: skip


class DistillObjective:
    """Token KL towards the teacher on sequences the teacher or the student samples."""

    command = "distill"
    kind = "distill"
    summary_keys = ("model", "teacher", "env", "steps", "kl_first", "kl_last",
                    "accuracy_before", "accuracy_after", "checkpoint", "wall_s")  # fmt: skip

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False,
                 dist: Dist | None = None) -> None:  # fmt: skip
        """`dist`: this process's rank; sharded, rank 0 samples the sequences and every
        rank trains on its share of them (`rldojo.training.distributed`)."""
        self.dist = dist or Dist()
        cfg, self.precision, self.threads = resolve_resources(config)
        self.config, self.run_dir, d = cfg, run_dir, cfg.distill
        self.mixture = build_mixture(cfg)  # env ids and kwargs checked
        checkpoint = latest_checkpoint(run_dir / "checkpoints") if resume else None
        models.check_model(cfg.model.name)
        models.check_model(d.teacher)
        check_training_model(cfg.model, checkpoint, cfg.run.cluster)
        seed_everything(cfg.run.seed, cfg.run.deterministic)
        self.device = rank_device(self.precision.device, self.dist)
        check_shardable(cfg, self.dist, self.device)
        self.model, self.tokenizer = load_training_model(
            cfg.model, checkpoint, self.device, lambda name: models.load_model(name)
        )  # late-bound: tests replace `load_model`
        teacher, teacher_tok = models.load_model(d.teacher)
        _check_tokenizers(teacher_tok, self.tokenizer)
        self.teacher = teacher.to(self.device).eval().requires_grad_(False)
        self.tasks = [t for slot in self.mixture.slots.values() for t in slot.train_tasks]
        random.Random(cfg.run.seed).shuffle(self.tasks)
        if self.dist.main:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(run_dir / "config.toml", dump_config(cfg))
        self._samplers()
        self.total_steps = cfg.run.steps
        self._optimizer(checkpoint)
        self.threshold = pass_threshold(cfg, self.mixture)
        self.grader = self.mixture.grader()
        self.over_budget: RunStopped | None = None
        self._loop = asyncio.new_event_loop()  # one for the run's life: grader pools bind

    def _samplers(self) -> None:
        """The student's sampler (`policy`, for student sequences and evaluations) and the
        step's sampler. Sharded: student and teacher split across the ranks, and rank 0
        samples from whole copies (the student's refreshed from the gathered weights)."""
        cfg, d = self.config, self.config.distill
        self.gen_model: Any = self.model
        gen_teacher: Any = self.teacher
        if self.dist.sharded:
            main = self.dist.main
            self.gen_model = copy.deepcopy(self.model) if main else None
            gen_teacher = copy.deepcopy(self.teacher) if main and d.sequences == "teacher" \
                else None  # fmt: skip
            for model in (self.model, self.teacher):
                shard_model(
                    model,
                    self.dist,
                    self.device,
                    cfg.model.autocast_bf16 is True,
                    offload=cfg.run.cpu_offload,
                )
        self.policy: Any = None
        self.sampler: Any = None
        if self.gen_model is not None:
            gen_dtype = self.precision.torch_generation_dtype()
            self.policy = make_policy(cfg, self.gen_model, self.tokenizer, gen_dtype)
            self.sampler = self.policy if d.sequences == "student" else TransformersPolicy(
                gen_teacher, self.tokenizer, generation_dtype=gen_dtype)  # fmt: skip

    def _optimizer(self, checkpoint: Path | None) -> None:
        """AdamW (fused, as rldojo train's) and `optim`'s schedule; restored from `checkpoint`."""
        o = self.config.optim
        self.params = trainable_parameters(self.model)
        self.optimizer, self.scheduler = adamw_with_schedule(
            self.params, o, lr=o.lr, warmup=o.warmup_steps, total=self.total_steps
        )
        self.step_num = 0
        self.evals: dict[str, dict[str, Any]] = {}
        self.kl_first: float | None = None
        self.kl_last: float | None = None
        if checkpoint is not None:
            state = restore_trainer_state(checkpoint, self.model, self.optimizer,
                                          self.scheduler, self.dist)  # fmt: skip
            self.step_num, self.evals = int(state["step"]), state.get("evals", {})
            self.kl_first, self.kl_last = state.get("kl_first"), state.get("kl_last")

    def header(self) -> list[str]:
        d = self.config.distill
        return [
            f"[bold]rldojo distill[/] {d.teacher} -> {self.config.model.name} on "
            f"{self.config.env.id} ({d.divergence} KL, {d.sequences} sequences) -> {self.run_dir}",
            f"precision: {self.precision.describe()}",
            f"threads: {self.threads.describe()}",
        ]

    def preflight(self) -> RunStopped | None:
        return None

    def evaluates(self, label: str) -> bool:
        return self.config.eval.tasks > 0 and (label != "before" or self.config.eval.before)

    def _rollouts(self) -> list[Rollout]:
        """This step's sequences: one sample per prompt from the generating model."""
        cfg, n = self.config, self.config.rollout.prompts_per_step
        chosen = [self.tasks[(self.step_num * n + i) % len(self.tasks)] for i in range(n)]
        seed = cfg.run.seed * 1_000_003 + self.step_num
        s = cfg.sampling
        sampling = SamplingParams(s.max_new_tokens, s.temperature, s.top_p, tuple(s.stop), seed)
        requests = [(t, 0, seed + i) for i, t in enumerate(chosen)]
        ro = cfg.rollout
        rollouts = self._loop.run_until_complete(collect_rollouts(
            self.mixture.make_env_for, self.sampler, requests, sampling,
            env_timeout_s=ro.env_timeout_s, max_turns=ro.max_turns,
            max_episode_tokens=ro.max_episode_tokens,
        ))  # fmt: skip
        return [r for r in rollouts if r.trainable]

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        rollouts = self.dist.broadcast(self._rollouts() if self.dist.main else [])
        metrics: dict[str, Any] = {"distill/sequences": len(rollouts)}
        if rollouts:
            batch = build_token_batch(rollouts, self.tokenizer.pad_token_id)
            metrics |= self._train_on(batch)
            self.kl_first = metrics["loss/kl"] if self.kl_first is None else self.kl_first
            self.kl_last = metrics["loss/kl"]
            if self.config.distill.sequences == "student":
                self._publish()
        else:
            metrics["train/skipped"] = 1  # no episode produced a sequence to train on
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step_num += 1
        metrics["time/step"] = time.perf_counter() - t0
        return metrics

    def _publish(self) -> None:
        """The student's weights to its sampler (sharded: gathered into rank 0's copy)."""
        if self.dist.sharded:
            lora = self.config.model.lora is not None
            gather_into(self.model, self.gen_model, self.dist, adapters_only=lora)
        if self.policy is not None:
            self.policy.update_weights(None)

    def _train_on(self, batch: TokenBatch) -> dict[str, Any]:
        """The KL over this rank's micro-batches (all of them in one process), over the
        whole batch's token count; one optimizer step."""
        cfg, d, world = self.config, self.config.distill, self.dist.world
        tokens = max(int(batch.policy_mask.sum()), 1)
        batch = batch.to(self.device)
        autocast = partial(forward_context, cfg, self.model, self.device)
        size = cfg.optim.micro_batch_size
        step = [list(range(k, min(k + size, batch.size))) for k in range(0, batch.size, size)]
        mine, padding = rank_micro_batches(step, self.dist, size)
        total = 0.0
        for k, rows in enumerate(mine):
            mb, weight = batch.rows(rows), 0.0 if k >= len(mine) - padding else 1.0
            with torch.no_grad(), autocast():
                t_logits = completion_logits(self.teacher, mb, share_prefix=False)  # [M, T, V']
            with autocast():
                s_logits = completion_logits(self.model, mb, share_prefix=False)  # [M, T, V]
            loss_sum, _ = token_kl(
                s_logits, t_logits, mb.policy_mask,
                divergence=d.divergence, temperature=d.kd_temperature,
            )  # fmt: skip
            scale = weight * world  # the sharded model averages the ranks' gradients
            (loss_sum / tokens if scale == 1.0 else scale * loss_sum / tokens).backward()
            total += weight * float(loss_sum.detach())
        total = self.dist.sum(total)
        grad_norm, stepped = clipped_step(self.optimizer, self.params, cfg.optim.grad_clip)
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss/kl": total / tokens, "optim/grad_norm": float(grad_norm), "tokens": tokens,
                "optim/nonfinite_skipped": float(not stepped)}  # fmt: skip

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        return []

    def step_line(self, step: int, m: dict[str, Any]) -> str:
        if "loss/kl" not in m:
            return f"step {step:>3} no sequence to train on (every episode failed)"
        return (f"step {step:>3} KL/token {m['loss/kl']:.4f} tokens {m['tokens']} "
                f"grad {m['optim/grad_norm']:.2f} {m['time/step']:.1f}s")  # fmt: skip

    def evaluate(self, label: str, progress: TurnProgress | None = None) -> EvalResult | None:
        """Rank 0 evaluates on the student's sampler, given the current weights; every
        rank gets the record."""
        self._publish()  # the sampler sees the trained weights
        result = None
        if self.policy is not None:
            tasks = heldout_tasks(self.config, self.mixture.test_tasks, label)
            result = heldout_eval(self.config, self.mixture.make_env_for, self.grader,
                                  self.policy, tasks, self.threshold, self._loop,
                                  progress)  # fmt: skip
        record = eval_record(result) if result is not None else None
        self.evals[label] = self.dist.broadcast(record)
        return result

    def save(self) -> Path:
        """A checkpoint (rank 0 writes it): whole weights and, sharded, the optimizer's
        state by parameter name (any world size resumes it)."""
        state = {"distill": True, "evals": self.evals, "kl_first": self.kl_first,
                 "kl_last": self.kl_last, "world_size": self.dist.world}  # fmt: skip
        return save_on_ranks(self.run_dir / "checkpoints", self.step_num, model=self.model,
                             writer=self.gen_model, tokenizer=self.tokenizer,
                             optimizer=self.optimizer, scheduler=self.scheduler, state=state,
                             d=self.dist, files=self.config.run.checkpoint_format,
                             gather=True)  # fmt: skip

    def summary(self) -> dict[str, Any]:
        d = self.config.distill
        return {"model": self.config.model.name, "teacher": d.teacher, "env": self.config.env.id,
                "divergence": d.divergence, "sequences": d.sequences, "kl_first": self.kl_first,
                "kl_last": self.kl_last, "precision": self.precision.as_dict()}  # fmt: skip

    def close(self) -> None:
        close = getattr(self.grader, "close", None)
        if close is not None and asyncio.iscoroutine(result := close()):
            self._loop.run_until_complete(result)
        self._loop.close()
