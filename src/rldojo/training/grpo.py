"""The GRPO objective: policy gradient where only forking tokens carry gradient.

`GrpoObjective.step()` is the whole data flow, top to bottom:

    graded groups from the experience (`rldojo.training.experience`: draw tasks -> roll
    out G samples per task -> grade -> ledger (durable) -> refill groups without signal)
    -> drop groups without signal (dynamic sampling; else a partial batch)
    -> group advantages -> token entropy -> top-ρ forking-token mask
    -> micro-batched clipped loss with gradient accumulation -> AdamW step
    -> new weights to the sampler -> metrics

Grader and environment failures arrive here as statuses; they are counted and excluded
from the gradient (a failed sample is neither a 0 reward nor a group member). What the
run trains with (model, optimizer, sampler, evaluation, checkpoints) is the run's
(`rldojo.training.run.Run`); this module adds the step line, RUN/samples.jsonl (a few
graded samples per step), the diagnosis of a step without signal
(`rldojo.training.no_signal`), the grader preflight and the summary's rollout counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import torch

from rldojo.config.recipes import clip_note, describe_recipe
from rldojo.policy.vllm_backend import check_vllm
from rldojo.rollout.groups import Collected, Group
from rldojo.training.experience import Experience
from rldojo.training.failure_budget import FailureBudget, reference_preflight
from rldojo.training.group_batch import group_batch
from rldojo.training.no_signal import signal_watch
from rldojo.training.run import Run
from rldojo.training.step_metrics import rollout_metrics
from rldojo.training.stops import FailureBudgetExceeded, RunStopped
from rldojo.training.update import PolicyUpdate, release_freed_memory, token_advantages

__all__ = ["GrpoObjective", "step_line", "trainable"]


def step_line(step: int, m: dict[str, Any], pass_threshold: float = 1.0) -> str:
    g = m.get
    at = "" if pass_threshold == 1.0 else f"(>={pass_threshold:g})"
    return (
        f"step {step:>3} reward {g('reward/mean', 0):+.2f} pass{at} {g('reward/pass_rate', 0):.2f}"
        f" len {g('rollout/completion_len', 0):3.0f} H80 {g('entropy/p80', 0):.2f}"
        f" fork {g('entropy/tokens_selected', 0)}/{g('entropy/tokens_policy', 0)}"
        f" groups {g('rollout/groups_informative', 0)}/{g('rollout/groups', 0)}"
        f" gen {g('time/generate', 0):.0f}s train {g('time/train', 0):.0f}s"
        + _engine(g("time/decode_batch"))
        + _reused(g("rollout/reused"))
    )


def _engine(occupancy: float | None) -> str:
    """The inference engine's mean decode batch over the step (the episodes engine)."""
    return f" decode batch {occupancy:.1f}" if occupancy else ""


def _reused(n: float | None) -> str:
    """Rollouts a step took from the ledger (a resumed run's), never silently."""
    return f" reused {n:.0f} rollouts from the ledger" if n else ""


class GrpoObjective:
    """`rldojo train`'s objective: rollouts -> forking-token mask -> clipped policy loss."""

    command = "train"
    kind = "train"
    summary_keys = (
        "model",
        "env",
        "steps",
        "accuracy_before",
        "accuracy_after",
        "mean_step_s",
        "wall_s",
        "rollouts",
        "rollouts_trained",
        "statuses",
        "run_dir",
    )

    def __init__(self, run: Run) -> None:
        """Sharded, rank 0 rolls out, grades and keeps the ledger, and every rank trains
        on its groups."""
        cfg = run.config
        self.run, self.config = run, cfg
        assert run.mixture is not None and run.grader is not None  # Run(tasks=True)
        self.envs, self.grader = run.mixture, run.grader
        check_vllm(cfg)  # generation.backend = "vllm": its package and settings
        run.load(sampler=True)
        self.ref_model = run.reference() if cfg.loss.kl_coef > 0 else None
        self.total_steps = cfg.run.steps
        self.policy_updates = 0  # weight updates so far (the trainer's policy version)
        self.experience = (
            None
            if not run.dist.main
            else Experience(run, self.envs, self.grader, lambda: self.policy_updates)
        )
        run.start(self)
        if run.resume and self.experience is not None:
            self.experience.ledger.rollback(run.step_num)  # training after the checkpoint
        self._selection: dict[int, tuple[float, list[int]]] = {}  # of the last train_on
        self.failures = FailureBudget(cfg.run.max_failure_rate, cfg.run.failure_window)
        self.over_budget: FailureBudgetExceeded | None = None  # the loop raises it
        self.watch = signal_watch(cfg, self.envs)  # says why a step had no signal
        if self.experience is not None and self.experience.ray_pool is not None:
            assert run.gen_model is not None  # rank 0 samples
            self.experience.ray_pool.publish(run.gen_model, self.policy_updates)

    @cached_property
    def update(self) -> PolicyUpdate:
        """The policy update over the run's model, optimizer and this KL reference."""
        run = self.run
        return PolicyUpdate(run.model, self.ref_model, run.optimizer, self.config, run.dist)

    @property
    def ledger(self) -> Any:
        """Rank 0's ledger (None on the other ranks)."""
        return None if self.experience is None else self.experience.ledger

    # ------------------------------------------------------------------ the flow

    def step(self) -> dict[str, Any]:
        """One optimizer step: collect informative groups, then train on them. Sharded,
        rank 0 collects and every rank trains on its share of the same groups."""
        started = time.perf_counter()
        run = self.run
        collected: Collected | None = None
        metrics: dict[str, Any] = {}
        trained: list[Group] = []
        if self.experience is not None:
            collected = self.experience.collect(run.step_num, self.policy_updates)
            metrics, trained = self._signal(collected)
        metrics["optim/lr"] = run.lr()
        trained = run.dist.broadcast(trained)
        timing = {} if collected is None else collected.timing
        if trained:
            t0 = time.perf_counter()
            release_freed_memory()  # what generation freed, before the gradients are made
            metrics |= self.train_on(trained)
            timing["time/train"] = time.perf_counter() - t0
            if self.ledger is not None:
                ids = [i for g in trained for i in g.ledger_ids]
                self.ledger.mark_trained(ids, run.step_num + 1, self._selection)
        else:
            metrics["train/skipped"] = 1  # no signal in any group: no update this step
        over = (
            None
            if collected is None
            else self.failures.observe(run.step_num + 1, collected.rollouts, collected.scores)
        )
        self.over_budget = run.dist.broadcast(over)  # every rank stops with rank 0
        if collected is not None:
            self._log_step(metrics, collected, started)
        return metrics

    def _signal(self, collected: Collected) -> tuple[dict[str, Any], list[Group]]:
        """The rollouts' metrics and the groups to train on: informative ones, at most
        `rollout.prompts_per_step` (the rest are counted, untrained)."""
        groups = collected.groups
        metrics = rollout_metrics(
            collected.rollouts,
            collected.scores,
            groups,
            self.config.rollout,
            self.run.pass_threshold,
        )
        metrics["rollout/extra_rounds"] = collected.rounds
        informative = [g for g in groups if g.informative]
        trained = informative[: self.config.rollout.prompts_per_step]
        metrics["rollout/groups_surplus"] = len(informative) - len(trained)
        return metrics, trained

    def _log_step(self, metrics: dict[str, Any], collected: Collected, started: float) -> None:
        """The step's timings, rates and worker metrics into `metrics`, then the ledger."""
        assert self.experience is not None
        timing = collected.timing
        timing["time/step"] = time.perf_counter() - started
        n_tokens = sum(len(r.completion_ids) for r in collected.rollouts)
        metrics |= timing | {
            "time/tokens_per_s_generate": n_tokens / max(timing["time/generate"], 1e-9)
        }
        metrics |= collected.task_metrics  # taken by the sampler's own thread (see sources)
        metrics |= self.experience.worker_metrics()
        self.experience.ledger.add_step(self.run.step_num + 1, metrics)

    def train_on(self, groups: Sequence[Group]) -> dict[str, Any]:
        """Advantages -> entropy -> forking-token mask (`rldojo.training.group_batch`) ->
        accumulated loss -> optimizer step -> the new weights to the sampler."""
        run = self.run
        gb = group_batch(groups, self.config, run.pad_id, self.update.entropy, run.step_num)
        self._selection = gb.selection()
        token_adv = token_advantages(gb.advantages, gb.scores, gb.batch.policy_mask.shape[1])
        metrics = self.update.optimize(gb.batch, token_adv, gb.selected, self.policy_updates)
        published = time.perf_counter()
        self.publish()
        metrics["time/update_weights"] = time.perf_counter() - published  # to the sampler
        return metrics | gb.metrics(self.config, run.tokenizer)

    def publish(self) -> None:
        """The new weights to the sampler and the Ray rollout workers; the policy
        version += 1."""
        self.run.publish()
        self.policy_updates += 1
        if self.experience is not None and self.experience.ray_pool is not None:
            # here, not in a rollout thread: the optimizer is idle
            assert self.run.gen_model is not None  # rank 0 samples
            self.experience.ray_pool.publish(self.run.gen_model, self.policy_updates)

    # ------------------------------------------------------------------ the loop's

    def header(self) -> list[str]:
        cfg, run = self.config, self.run
        clip = clip_note(cfg)  # said once: the clip-higher bound does nothing here
        return [
            f"[bold]rldojo train[/] {cfg.model.name} on {cfg.env.id} -> {run.run_dir}",
            f"precision: {run.precision.describe()}",
            f"threads: {run.threads.describe()}",
            f"device: {run.device} (run.device = {cfg.run.device!r}); {trainable(run.model)}",
            *describe_recipe(cfg),
            *([f"note: {clip}"] if clip else []),
        ]

    def preflight(self) -> RunStopped | None:
        """The grader on the reference answers (rank 0; every rank gets its verdict)."""
        if self.config.run.max_failure_rate >= 1.0:
            return None
        return self.run.dist.broadcast(self.grader_preflight() if self.run.dist.main else None)

    def grader_preflight(self) -> FailureBudgetExceeded | None:
        """The stop when the grader fails on every reference answer (`train.failures`)."""
        assert self.experience is not None
        return reference_preflight(
            self.envs,
            self.experience.grader,
            self.run.loop,
            timeout_s=self.config.rollout.grade_timeout_s,
        )

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        if self.ledger is None:  # not rank 0: it writes the samples and says why
            return []
        step = self.run.step_num
        with (self.run.run_dir / "samples.jsonl").open("a") as f:
            for row in self.ledger.samples(step - 1):
                f.write(json.dumps({"step": step, **row}) + "\n")
        why = self.watch.observe(step, metrics)
        return [] if why is None else [why]

    def step_line(self, step: int, metrics: dict[str, Any]) -> str:
        return step_line(step, metrics, self.run.pass_threshold)

    def state_dict(self) -> dict[str, Any]:
        """The draw position and the policy version (the weights are the run's)."""
        draws = {} if self.experience is None else self.experience.state_dict()
        return {**draws, "policy_version": self.policy_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.experience is not None:
            self.experience.load_state_dict(state)
        self.policy_updates = state.get("policy_version", int(state["step"]))
        if self.run.policy is not None:
            self.run.policy.version = self.policy_updates

    def summary(self) -> dict[str, Any]:
        cfg, run = self.config, self.run
        if self.ledger is None:  # not rank 0, which writes the summary
            return {"model": cfg.model.name, "env": cfg.env.id}
        steps = self.ledger.step_metrics()
        step_times = [m["time/step"] for m in steps if "time/step" in m]
        return {
            "model": cfg.model.name,
            "env": cfg.env.id,
            "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
            "rollouts": self.ledger.count(),
            "rollouts_trained": self.ledger.count(trained=True),
            "statuses": self.ledger.status_counts(),
            "no_signal": [found.as_dict() for found in self.watch.report(steps)],
            "precision": run.precision.as_dict(),
            "device": str(run.device),
            "threads": run.threads.as_dict(),
        }

    def close(self) -> None:
        if self.experience is not None:
            self.experience.close()


def trainable(model: torch.nn.Module) -> str:
    """'full fine-tuning, N parameters' or 'LoRA: N of M parameters train'."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trained == total:
        return f"full fine-tuning, {total / 1e6:.1f}M parameters"
    return f"LoRA: {trained / 1e6:.2f}M of {total / 1e6:.1f}M parameters train"
