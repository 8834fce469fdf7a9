"""Supervised fine-tuning on demonstrations: the cold start before RL.

`run_sft(config, data)` is what `rldojo sft` calls. A demonstration is one conversation
(`rldojo demos` writes them: an expert's or a teacher's episode, with the environment's
real observations). Each is replayed through the rollout engine
(`rldojo.rollout.replay.conversation_rollout`), so SFT sees exactly the tokens and the
mask an RL rollout of the same text has: the loss is on the assistant's tokens only (the
content and its end-of-turn token); the prompt, tool results, environment turns and the
chat template's text between turns are masked.

Per optimizer step `sft.batch_size` demonstrations (shuffled per epoch with `run.seed`),
sorted by length and cut into micro-batches of `optim.micro_batch_size` rows (length
bucketing: little padding), gradients accumulated; the loss is the mean negative
log-likelihood over the step's assistant tokens. The output layer runs at those tokens
alone where the model allows it (`rldojo.train.batch.selected_logits`).

Run directory (`run.output_dir`/`run.name`), the layout of `rldojo train`'s:

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

import asyncio
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rldojo.config import TrainConfig, dump_config
from rldojo.data.loading import DataError
from rldojo.policy.lora import trainable_parameters
from rldojo.policy.models import check_model, load_model
from rldojo.policy.training_model import check_training_model, load_training_model, make_policy
from rldojo.report.metrics import MetricsLogger
from rldojo.store.checkpoint import save_checkpoint
from rldojo.store.files import write_atomically
from rldojo.store.run_dir import claim_run_dir
from rldojo.train.batch import (
    build_token_batch,
    completion_logits,
    selected_logits,
    splits_output_layer,
)
from rldojo.train.demo_data import (
    Demo,
    assistant_turn_tokens,
    read_demos,
    tokenize_demos,
    turn_budget,
)
from rldojo.train.heldout import eval_record, heldout_eval, heldout_tasks, log_eval
from rldojo.train.interrupts import Interrupts
from rldojo.train.loop import new_run_dir
from rldojo.train.preflight import build_mixture, pass_threshold
from rldojo.train.resources import resolve_resources
from rldojo.train.stops import RunInterrupted
from rldojo.train.trainer import lr_lambda, seed_everything
from rldojo.train.update import clipped_step, forward_context
from rldojo.types import Rollout

__all__ = [
    "Demo",
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
    model: Any,
    rollouts: Sequence[Rollout],
    micro_batches: Sequence[Sequence[int]],
    *,
    pad_id: int,
    autocast: Callable[[], Any],
) -> tuple[float, int]:
    """Accumulate the gradient of one step's mean assistant-token NLL (no optimizer step);
    `autocast` makes each forward's precision context. Returns `(loss, assistant tokens)`."""
    total = sum(sum(rollouts[i].policy_mask) for mb in micro_batches for i in mb)
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device)
    split = splits_output_layer(model)
    for mb in micro_batches:
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
        (nll / max(total, 1)).backward()
        loss_sum += nll.detach()
    return float(loss_sum) / max(total, 1), total


def run_sft(
    config: TrainConfig,
    data: str | os.PathLike[str] | None = None,
    *,
    run_dir: Path | None = None,
    overwrite: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Fine-tune `config.model` on the demonstrations; returns the summary (also written
    to RUN/summary.json). Every input is checked before the run directory exists; a
    directory that holds a run is refused (`RunDirError`) unless `overwrite` moves it
    aside. A signal stops it after the step in flight (a checkpoint of the steps so far,
    `stopped` = "interrupted", `RunInterrupted`)."""
    console = console or Console()
    started = time.perf_counter()
    cfg, precision, threads = resolve_resources(config)
    s = cfg.sft
    if not s.lora:  # a full-weight cold start; RL adds the adapters to its checkpoint
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": None})})
    path = str(data or s.data or "")
    if not path:
        raise DataError("sft.data", None, "no demonstrations: pass --data FILE or set sft.data")
    demos, not_passed = read_demos(path, only_passed=s.only_passed)
    mixture = build_mixture(cfg) if cfg.eval.tasks else None  # env ids and kwargs checked
    check_model(cfg.model.name)
    check_training_model(cfg.model, None, cfg.run.cluster)
    seed_everything(cfg.run.seed, cfg.run.deterministic)
    run_dir = run_dir or new_run_dir(cfg)
    moved = claim_run_dir(run_dir, command="sft", overwrite=overwrite)
    if moved is not None:
        console.print(f"--overwrite: the run that was in {run_dir} is now in {moved}")
    device = torch.device(precision.device)
    model, tokenizer = load_training_model(cfg.model, None, device, load_model)
    demo_set = tokenize_demos(demos, tokenizer, max_seq_len=s.max_seq_len, path=path)
    demo_set.skipped["not_passed"] += not_passed
    if not demo_set.rollouts:
        raise DataError(path, None, f"no demonstration left to train on ({dict(demo_set.skipped)})")
    budget = turn_budget(cfg, demo_set.rollouts)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / "config.toml", dump_config(cfg))
    console.print(
        f"[bold]rldojo sft[/] {cfg.model.name} on {len(demo_set.rollouts)} demonstrations "
        f"from {path} -> {run_dir} (left out: {dict(demo_set.skipped) or 'none'}); "
        f"threads: {threads.describe()}",
        soft_wrap=True,
    )
    console.print(f"precision: {precision.describe()}", soft_wrap=True)
    for key, over in budget["demos_over"].items():
        if over:
            console.print(
                f"[yellow]warning:[/] {over} of {len(demo_set.rollouts)} demonstrations have an "
                f"assistant turn longer than {key} = {budget['limits'][key]} tokens (longest "
                f"{budget['longest_turn_tokens']}): sampled with it, a policy cannot reproduce "
                "them; raise it",
                soft_wrap=True,
            )
    logger = MetricsLogger(run_dir, report_to=cfg.run.report_to, config=cfg.model_dump(mode="json"))
    evals: dict[str, dict[str, Any]] = {}
    loop: asyncio.AbstractEventLoop | None = None
    losses: list[float] = []
    signals = ExitStack()  # the handlers, restored when the run ends however it ends
    interrupts = signals.enter_context(Interrupts(lambda line: console.print(line, soft_wrap=True)))
    try:
        policy = make_policy(cfg, model, tokenizer, precision.torch_generation_dtype())
        threshold = pass_threshold(cfg, mixture) if mixture is not None else 1.0
        loop = asyncio.new_event_loop()  # one for both evaluations: grader pools bind to it
        grader = mixture.grader() if mixture is not None else None

        def heldout(label: str, step: int) -> dict[str, Any]:
            assert mixture is not None and loop is not None
            tasks = heldout_tasks(cfg, mixture.test_tasks, label)
            result = heldout_eval(cfg, mixture.make_env_for, grader, policy,
                                  tasks, threshold, loop)  # fmt: skip
            log_eval(console, logger, run_dir, label, step, result)
            return eval_record(result)

        if mixture is not None and s.eval_before and cfg.eval.before:
            with interrupts.immediate():
                evals["before"] = heldout("before", 0)
        steps = sft_schedule(
            [len(r.prompt_ids) + len(r.completion_ids) for r in demo_set.rollouts],
            batch_size=s.batch_size, micro_batch_size=cfg.optim.micro_batch_size,
            epochs=s.epochs, seed=cfg.run.seed,
        )  # fmt: skip
        optimizer, scheduler, skipped = _sft_steps(
            cfg,
            model,
            tokenizer,
            demo_set.rollouts,
            steps,
            device,
            logger,
            console,
            interrupts,
            losses,
        )
        done = len(losses)
        policy.update_weights(None)  # the sampler sees the trained weights
        if mixture is not None and not interrupts.requested:
            with interrupts.immediate():
                evals["after"] = heldout("after", done)
        checkpoint = save_checkpoint(
            run_dir / "checkpoints", model=model, tokenizer=tokenizer, optimizer=optimizer,
            scheduler=scheduler, step=done, state={"sft": True, "evals": evals},
        )  # fmt: skip
    except KeyboardInterrupt:  # during an evaluation, or a second signal: nothing saved
        raise _sft_interrupted(run_dir, len(losses), None, aborted=interrupts.aborted) from None
    finally:
        signals.close()
        logger.close()
        if loop is not None:
            loop.close()
    summary = {
        "model": cfg.model.name,
        "data": path,
        "demonstrations": len(demo_set.rollouts),
        "left_out": dict(demo_set.skipped),
        "assistant_tokens": sum(sum(r.policy_mask) for r in demo_set.rollouts),
        "turn_budget": budget,
        "steps": done,
        "steps_planned": len(steps),
        "stopped": "interrupted" if interrupts.requested else "steps",
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "nonfinite_skipped": skipped,
        "accuracy_before": evals.get("before", {}).get("accuracy"),
        "accuracy_after": evals.get("after", {}).get("accuracy"),
        "evals": evals,
        "checkpoint": str(checkpoint),
        "wall_s": time.perf_counter() - started,
        "precision": precision.as_dict(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if interrupts.requested:
        raise _sft_interrupted(run_dir, done, checkpoint)
    console.print(
        f"sft: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(steps)} steps; checkpoint "
        f"{checkpoint}\nnext: rldojo train CONFIG --set model.name={checkpoint}",
        soft_wrap=True,
    )
    return summary


def _sft_steps(
    cfg: TrainConfig,
    model: Any,
    tokenizer: Any,
    rollouts: Sequence[Rollout],
    steps: list[list[list[int]]],
    device: torch.device,
    logger: MetricsLogger,
    console: Console,
    interrupts: Interrupts,
    losses: list[float],
) -> tuple[torch.optim.Optimizer, Any, int]:
    """The optimizer steps of `sft_schedule`, stopped early after the step in flight when
    a signal asks; each step's loss appended to `losses`. The optimizer, the scheduler and
    the number of steps skipped for a non-finite gradient."""
    s = cfg.sft
    params = trainable_parameters(model)
    # fused, as rldojo train's: one kernel per parameter, no full-size temporaries.
    optimizer = torch.optim.AdamW(params, lr=s.lr, betas=cfg.optim.betas,
                                  weight_decay=cfg.optim.weight_decay, fused=True)  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: lr_lambda(k, s.warmup_steps, len(steps), cfg.optim.schedule)
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    skipped = 0  # steps whose gradient was NaN or inf
    autocast = partial(forward_context, cfg, model, device)
    for k, micro_batches in enumerate(steps, start=1):
        if interrupts.requested:
            break
        t0 = time.perf_counter()
        loss, tokens = sft_step(model, rollouts, micro_batches, pad_id=pad_id,
                                autocast=autocast)  # fmt: skip
        lr = scheduler.get_last_lr()[0]
        norm, stepped = clipped_step(optimizer, params, cfg.optim.grad_clip)
        grad_norm = float(norm)
        skipped += not stepped
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss)
        metrics = {"sft/loss": loss, "sft/tokens": tokens, "sft/grad_norm": grad_norm,
                   "sft/lr": lr, "sft/nonfinite_skipped": float(not stepped),
                   "time/step": time.perf_counter() - t0}  # fmt: skip
        logger.log(k, metrics, kind="sft")
        console.print(f"sft step {k:>3}/{len(steps)} loss {loss:.4f} tokens {tokens} "
                      f"lr {lr:.2e}", soft_wrap=True)  # fmt: skip
        if not stepped:
            console.print(f"warning: sft step {k}: gradient norm {grad_norm}, step "
                          "skipped (weights unchanged)", soft_wrap=True)  # fmt: skip
    return optimizer, scheduler, skipped


def _sft_interrupted(run_dir: Path, step: int, checkpoint: Path | None, *,
                     aborted: bool = False) -> RunInterrupted:  # fmt: skip
    saved = "nothing saved" if checkpoint is None else (
        f"checkpoint {checkpoint.name} (rldojo train can start from it)")  # fmt: skip
    return RunInterrupted(
        f"{'aborted' if aborted else 'interrupted'} at sft step {step}; {saved}; sft does not "
        f"resume: to start over, run it again with --overwrite ({run_dir} moves aside)",
        step=step, checkpoint=None if checkpoint is None else checkpoint.name,
    )  # fmt: skip
