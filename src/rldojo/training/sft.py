"""Supervised fine-tuning on demonstrations: the cold start before RL.

`run_sft(config, data)` is what `rldojo sft` calls. A demonstration is one conversation
(`rldojo demos` writes them: an expert's or a teacher's episode, with the environment's
real observations). Each is replayed through the rollout engine
(`rldojo.rollout.replay.conversation_rollout`), so SFT sees exactly the tokens and the
mask an RL rollout of the same text has: the loss is on the assistant's tokens only (the
content and its end-of-turn token); the prompt, tool results, environment turns and the
chat template's text between turns are masked.

Per optimizer step `sft.batch_size` demonstrations (`run.epochs` passes, shuffled per
epoch with `run.seed`),
sorted by length and cut into micro-batches of `optim.micro_batch_size` rows (length
bucketing: little padding), gradients accumulated; the loss is the mean negative
log-likelihood over the step's assistant tokens. The output layer runs at those tokens
alone where the model allows it (`rldojo.training.batch.selected_logits`).

It runs in the run loop of `rldojo train` (`rldojo.training.loop`, objective `SftObjective`):
resume (`--resume RUN`: the same schedule from the checkpoint's step), checkpoints every
`run.checkpoint_every` steps, `run.max_minutes`, evaluations every `eval.every` steps,
interrupts, trackers and callbacks work as they do for RL. The run directory
(`run.output_dir`/`run.name`), the layout of `rldojo train`'s:

    RUN/config.toml      the config as used
    RUN/metrics.jsonl    one record per step (kind "sft": sft/loss, sft/tokens, ...)
                         and per evaluation (kind "eval", label "before" / "after")
    RUN/evals/LABEL.jsonl  per held-out task: task id, passed, value, status
    RUN/checkpoints/step_N/  the checkpoint format of `rldojo train`: start RL from it
                         with `--set model.name=RUN/checkpoints/step_N` (under LoRA it
                         holds the adapter: `rldojo export ... --merge` first)
    RUN/summary.json     demonstrations used and left out, loss first/last, accuracies,
                         `turn_budget` (the longest assistant turn; demonstrations with a
                         turn over `sampling.max_new_tokens` / `eval.max_new_tokens`, which
                         RL and the evaluations would cut: warned at the start)
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rldojo.config import TrainConfig, load_config
from rldojo.config.stages import for_objective
from rldojo.data.loading import DataError
from rldojo.training.batch import (
    build_token_batch,
    completion_logits,
    selected_logits,
    splits_output_layer,
)
from rldojo.training.callbacks import Callback
from rldojo.training.demo_data import (
    Demo,
    assistant_turn_tokens,
    read_demos,
    tokenize_demos,
    turn_budget,
)
from rldojo.training.distributed import is_sharded, rank_micro_batches
from rldojo.training.loop import new_run_dir, run_loop, with_console
from rldojo.training.run import Run
from rldojo.training.stops import RunStopped
from rldojo.training.update import forward_context
from rldojo.types import Rollout

__all__ = [
    "Demo",
    "SftObjective",
    "assistant_turn_tokens",
    "read_demos",
    "run_sft",
    "sft_schedule",
    "sft_step",
    "tokenize_demos",
]


def sft_schedule(
    lengths: Sequence[int], *, batch_size: int, micro_batch_size: int, epochs: int, seed: int
) -> list[list[list[int]]]:
    """Optimizer steps, each a list of micro-batches of demonstration indices: shuffled
    per epoch, then within a step sorted by length (longest first) and cut."""
    rng = random.Random(seed)
    steps: list[list[list[int]]] = []
    for _ in range(epochs):
        order = list(range(len(lengths)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = sorted(order[start : start + batch_size], key=lambda i: -lengths[i])
            steps.append(
                [chunk[i : i + micro_batch_size] for i in range(0, len(chunk), micro_batch_size)]
            )
    return steps


def sft_step(
    model: torch.nn.Module,
    rollouts: Sequence[Rollout],
    micro_batches: Sequence[Sequence[int]],
    *,
    pad_id: int,
    autocast: Callable[[], Any],
    total: int | None = None,
    padding: int = 0,
    world: int = 1,
) -> tuple[float, int]:
    """Accumulate the gradient of one step's mean assistant-token NLL (no optimizer step);
    `autocast` makes each forward's precision context. Returns `(loss, assistant tokens)`.
    On one of several ranks: `total` is the whole step's token count (the mean's
    denominator, so the ranks' gradients sum to the step's), and the last `padding`
    micro-batches only keep the ranks' forward passes in step (weight 0); the gradient is
    scaled by `world`, since the sharded model averages the ranks' gradients."""
    if total is None:
        total = sum(sum(rollouts[i].policy_mask) for mb in micro_batches for i in mb)
    device = torch.device(next(iter(model.state_dict().values())).device)
    loss_sum = torch.zeros((), device=device)
    # Sharded, the model's own forward gathers its outer weights (embeddings, output layer).
    split = splits_output_layer(model) and not is_sharded(model)
    weights = [1.0] * (len(micro_batches) - padding) + [0.0] * padding
    for mb, weight in zip(micro_batches, weights, strict=True):
        batch = build_token_batch([rollouts[i] for i in mb], pad_id).to(device)
        where = batch.policy_mask  # [M, T]
        with autocast():
            if split:
                logits = selected_logits(model, batch, where, share_prefix=False)  # [N, V]
            else:
                logits = completion_logits(model, batch, share_prefix=False)[where]  # [N, V]
        nll = torch.nn.functional.cross_entropy(
            logits.float(), batch.completion_ids[where], reduction="sum"
        )
        (weight * world * nll / max(total, 1)).backward()
        loss_sum += weight * nll.detach()
    return float(loss_sum) / max(total, 1), total


def run_sft(
    config: TrainConfig,
    data: str | os.PathLike[str] | None = None,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: Sequence[Callback] = (),
    console: Console | None = None,
) -> dict[str, Any]:
    """Fine-tune `config.model` on the demonstrations (`data`, else `sft.data`; a resume
    reads the run's own); returns the summary (also RUN/summary.json). Every input is
    checked before the run directory is written; the run directory rules, interrupts and
    resume are the run loop's (`rldojo.training.loop.run_loop`)."""
    run_dir = run_dir or new_run_dir(config)
    path = str(data or config.sft.data or "")
    if resume and not path and (run_dir / "config.toml").exists():
        path = load_config(run_dir / "config.toml").sft.data or ""
    if not path:
        raise DataError("sft.data", None, "no demonstrations: pass --data FILE or set sft.data")
    # The file as used is part of the config: config.toml records it, a resume reads it.
    config = config.model_copy(update={"sft": config.sft.model_copy(update={"data": path})})
    config = for_objective(config, "sft")  # [sft.optim] etc. over the shared sections
    return run_loop(
        lambda d: SftObjective(Run(config, run_dir, resume=resume, dist=d, tasks=False)),
        config,
        run_dir,
        command="sft",
        resume=resume,
        overwrite=overwrite,
        callbacks=with_console(callbacks, console),
    )


class SftObjective:
    """Assistant-token NLL on demonstrations, one `sft_schedule` step at a time."""

    command = "sft"
    kind = "sft"
    summary_keys = (
        "model",
        "data",
        "demonstrations",
        "steps",
        "loss_first",
        "loss_last",
        "accuracy_before",
        "accuracy_after",
        "checkpoint",
        "wall_s",
    )

    def __init__(self, run: Run) -> None:
        cfg, s = run.config, run.config.sft
        self.run, self.config, self.data = run, cfg, str(s.data)
        demos, not_passed = read_demos(self.data, only_passed=s.only_passed)
        run.load(sampler=False)
        demo_set = tokenize_demos(demos, run.tokenizer, max_seq_len=s.max_seq_len, path=self.data)
        demo_set.skipped["not_passed"] += not_passed
        if not demo_set.rollouts:
            left = dict(demo_set.skipped)
            raise DataError(self.data, None, f"no demonstration left to train on ({left})")
        self.rollouts, self.skipped = demo_set.rollouts, dict(demo_set.skipped)
        self.budget = turn_budget(cfg, self.rollouts)
        self.schedule = sft_schedule(
            [len(r.prompt_ids) + len(r.completion_ids) for r in self.rollouts],
            batch_size=s.batch_size,
            micro_batch_size=cfg.optim.micro_batch_size,
            epochs=cfg.run.epochs,
            seed=cfg.run.seed,
        )
        self.total_steps = len(self.schedule)
        self.nonfinite = 0
        self.loss_first: float | None = None
        self.loss_last: float | None = None
        self.over_budget: RunStopped | None = None
        run.start(self)

    def header(self) -> list[str]:
        run = self.run
        lines = [
            f"[bold]rldojo sft[/] {self.config.model.name} on {len(self.rollouts)} demonstrations "
            f"from {self.data} -> {run.run_dir} (left out: {self.skipped or 'none'}); "
            f"threads: {run.threads.describe()}",
            f"precision: {run.precision.describe()}",
        ]
        b = self.budget
        for key, over in b["demos_over"].items():
            if over:
                lines.append(
                    f"[yellow]warning:[/] {over} of {len(self.rollouts)} demonstrations have an "
                    f"assistant turn longer than {key} = {b['limits'][key]} tokens (longest "
                    f"{b['longest_turn_tokens']}): sampled with it, a policy cannot reproduce "
                    "them; raise it"
                )
        return lines

    def preflight(self) -> RunStopped | None:
        return None

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        run, cfg = self.run, self.config
        autocast = partial(forward_context, cfg, run.model, run.device)
        rows = self.schedule[run.step_num]
        mbs, padding = rank_micro_batches(rows, run.dist, cfg.optim.micro_batch_size)
        total = sum(sum(self.rollouts[i].policy_mask) for mb in rows for i in mb)
        loss, tokens = sft_step(
            run.model,
            self.rollouts,
            mbs,
            pad_id=run.pad_id,
            autocast=autocast,
            total=total,
            padding=padding,
            world=run.dist.world,
        )
        loss = run.dist.sum(loss)  # each rank's share of the step's mean
        lr = run.lr()
        norm, stepped = run.optimizer_step()
        self.nonfinite += not stepped
        self.loss_first = loss if self.loss_first is None else self.loss_first
        self.loss_last = loss
        return {
            "sft/loss": loss,
            "sft/tokens": tokens,
            "sft/grad_norm": norm,
            "sft/lr": lr,
            "sft/nonfinite_skipped": float(not stepped),
            "time/step": time.perf_counter() - t0,
        }

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        if metrics["sft/nonfinite_skipped"]:
            return [
                f"warning: sft step {self.run.step_num}: gradient norm "
                f"{metrics['sft/grad_norm']}, step skipped (weights unchanged)"
            ]
        return []

    def step_line(self, step: int, m: dict[str, Any]) -> str:
        epochs = self.config.run.epochs
        epoch = (step - 1) * epochs // max(self.total_steps, 1) + 1  # equal steps per epoch
        return (
            f"sft step {step:>3}/{self.total_steps} epoch {epoch}/{epochs} "
            f"loss {m['sft/loss']:.4f} "
            f"tokens {m['sft/tokens']} lr {m['sft/lr']:.2e}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "sft": True,
            "nonfinite_skipped": self.nonfinite,
            "loss_first": self.loss_first,
            "loss_last": self.loss_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nonfinite = int(state.get("nonfinite_skipped", 0))
        self.loss_first, self.loss_last = state.get("loss_first"), state.get("loss_last")

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.config.model.name,
            "data": self.data,
            "demonstrations": len(self.rollouts),
            "left_out": self.skipped,
            "assistant_tokens": sum(sum(r.policy_mask) for r in self.rollouts),
            "turn_budget": self.budget,
            "steps_planned": self.total_steps,
            "loss_first": self.loss_first,
            "loss_last": self.loss_last,
            "nonfinite_skipped": self.nonfinite,
            "precision": self.run.precision.as_dict(),
        }

    def close(self) -> None:
        pass
