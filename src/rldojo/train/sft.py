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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rldojo.config import TrainConfig, dump_config
from rldojo.data.loading import DataError, read_rows, require_field
from rldojo.policy.lora import trainable_parameters
from rldojo.policy.models import check_model, load_model
from rldojo.policy.training_model import check_training_model, load_training_model, make_policy
from rldojo.report.metrics import MetricsLogger
from rldojo.rollout.replay import conversation_rollout
from rldojo.store.checkpoint import save_checkpoint
from rldojo.store.files import write_atomically
from rldojo.train.batch import (
    build_token_batch,
    completion_logits,
    selected_logits,
    splits_output_layer,
)
from rldojo.train.heldout import eval_record, heldout_eval, heldout_tasks, log_eval
from rldojo.train.loop import new_run_dir
from rldojo.train.preflight import build_mixture, pass_threshold
from rldojo.train.resources import resolve_resources
from rldojo.train.trainer import lr_lambda, seed_everything
from rldojo.train.update import clipped_step, forward_context
from rldojo.types import Message, Rollout

__all__ = [
    "Demo",
    "assistant_turn_tokens",
    "read_demos",
    "run_sft",
    "sft_schedule",
    "sft_step",
    "tokenize_demos",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Demo:
    """One demonstration read from a file (`line` for error messages)."""

    line: int
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    task_id: str
    env: str


@dataclass
class DemoSet:
    """Demonstrations ready to train on, and what was left out (reason -> count)."""

    rollouts: list[Rollout]
    skipped: Counter[str] = field(default_factory=Counter)


def read_demos(path: str | os.PathLike[str], *, only_passed: bool = True) -> tuple[list[Demo], int]:
    """The file's demonstrations (checked before any model loads) and how many lines were
    left out as not passed. Raises `DataError` naming the file, line and field."""
    demos: list[Demo] = []
    not_passed = 0
    if not Path(path).exists():
        raise DataError(path, None, "file not found")
    for line, row in read_rows(path):
        messages = require_field(row, "messages", path, line, (list,))
        for i, m in enumerate(messages):
            where = f"field 'messages[{i}]'"
            if not isinstance(m, dict):
                raise DataError(path, line, f"{where}: expected object")
            if m.get("role") not in ROLES:
                raise DataError(path, line, f"{where}.role: expected one of {sorted(ROLES)}")
            if not isinstance(m.get("content"), str):
                raise DataError(path, line, f"{where}.content: expected str")
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(path, line, "field 'messages': no assistant turn to learn from")
        if messages[0]["role"] == "assistant":
            raise DataError(path, line, "field 'messages': starts with an assistant turn")
        tools = row.get("tools")
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise DataError(path, line, "field 'tools': expected a list of objects or null")
        if only_passed and row.get("passed") is False:
            not_passed += 1
            continue
        clean = [{"role": m["role"], "content": m["content"]} for m in messages]
        task_id = str(row.get("task_id") or f"line-{line}")
        demos.append(Demo(line, clean, tools, task_id, str(row.get("env") or "demo")))  # type: ignore[arg-type]
    return demos, not_passed


def tokenize_demos(
    demos: Sequence[Demo], tokenizer: Any, *, max_seq_len: int, path: str = "demos"
) -> DemoSet:
    """Each demonstration as the engine's `Rollout` (see the module docstring); longer
    than `max_seq_len` tokens is left out and counted (`too_long`)."""
    out = DemoSet([])
    for demo in demos:
        try:
            rollout = conversation_rollout(
                tokenizer, demo.messages, demo.tools, task_id=demo.task_id, env=demo.env
            )
        except ValueError as exc:
            raise DataError(path, demo.line, f"field 'messages': {exc}") from None
        if len(rollout.prompt_ids) + len(rollout.completion_ids) > max_seq_len:
            out.skipped["too_long"] += 1
            continue
        out.rollouts.append(rollout)
    return out


def assistant_turn_tokens(rollout: Rollout) -> list[int]:
    """Tokens in each assistant turn (each run of `policy_mask` ones: the content and its
    end-of-turn token): what a sampler has to generate, within `max_new_tokens`, to
    reproduce that turn."""
    runs: list[int] = []
    previous = False
    for trained in rollout.policy_mask:
        if trained and not previous:
            runs.append(0)
        if trained:
            runs[-1] += 1
        previous = bool(trained)
    return runs


def turn_budget(cfg: TrainConfig, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The longest assistant turn of the demonstrations, and how many demonstrations have
    a turn longer than the config's generation budgets. RL and the evaluations sample
    with those budgets: a turn that does not fit is cut there, so a policy cannot
    reproduce it (and a shorter, wrong turn can out-earn the cut right one)."""
    longest = [max(assistant_turn_tokens(r)) for r in rollouts]
    limits = {
        "sampling.max_new_tokens": cfg.sampling.max_new_tokens,
        "eval.max_new_tokens": cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens,
    }
    return {
        "longest_turn_tokens": max(longest),
        "demos_over": {key: sum(n > limit for n in longest) for key, limit in limits.items()},
        "limits": limits,
    }


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
    console: Console | None = None,
) -> dict[str, Any]:
    """Fine-tune `config.model` on the demonstrations; returns the summary (also written
    to RUN/summary.json). Every input is checked before the run directory exists."""
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
            evals["before"] = heldout("before", 0)
        steps = sft_schedule(
            [len(r.prompt_ids) + len(r.completion_ids) for r in demo_set.rollouts],
            batch_size=s.batch_size, micro_batch_size=cfg.optim.micro_batch_size,
            epochs=s.epochs, seed=cfg.run.seed,
        )  # fmt: skip
        params = trainable_parameters(model)
        # fused, as rldojo train's: one kernel per parameter, no full-size temporaries.
        optimizer = torch.optim.AdamW(params, lr=s.lr, betas=cfg.optim.betas,
                                      weight_decay=cfg.optim.weight_decay, fused=True)  # fmt: skip
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda k: lr_lambda(k, s.warmup_steps, len(steps), cfg.optim.schedule)
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        losses: list[float] = []
        skipped = 0  # steps whose gradient was NaN or inf
        autocast = partial(forward_context, cfg, model, device)
        for k, micro_batches in enumerate(steps, start=1):
            t0 = time.perf_counter()
            loss, tokens = sft_step(model, demo_set.rollouts, micro_batches, pad_id=pad_id,
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
        policy.update_weights(None)  # the sampler sees the trained weights
        if mixture is not None:
            evals["after"] = heldout("after", len(steps))
        checkpoint = save_checkpoint(
            run_dir / "checkpoints", model=model, tokenizer=tokenizer, optimizer=optimizer,
            scheduler=scheduler, step=len(steps), state={"sft": True, "evals": evals},
        )  # fmt: skip
    finally:
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
        "steps": len(steps),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "nonfinite_skipped": skipped,
        "accuracy_before": evals.get("before", {}).get("accuracy"),
        "accuracy_after": evals.get("after", {}).get("accuracy"),
        "evals": evals,
        "checkpoint": str(checkpoint),
        "wall_s": time.perf_counter() - started,
        "precision": precision.as_dict(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(
        f"sft: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(steps)} steps; checkpoint "
        f"{checkpoint}\nnext: rldojo train CONFIG --set model.name={checkpoint}",
        soft_wrap=True,
    )
    return summary
