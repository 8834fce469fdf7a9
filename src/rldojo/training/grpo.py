"""The GRPO objective: the `Trainer` (rollouts -> forking-token mask -> clipped policy
loss, `rldojo.training.trainer`) as the run loop (`rldojo.training.loop`) drives it.

What it adds to the trainer is what a run says and keeps besides the weights: the step
line, RUN/samples.jsonl (a few graded samples per step), the diagnosis of a step without
signal (`rldojo.training.signal`; the summary's `no_signal` groups every such step by its
cause), the grader preflight and the summary's rollout counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig
from rldojo.config.recipes import clip_note, describe_recipe
from rldojo.training.distributed import Dist
from rldojo.training.signal import signal_watch
from rldojo.training.stops import RunStopped
from rldojo.training.trainer import Trainer

__all__ = ["GrpoObjective", "step_line"]


def step_line(step: int, m: dict[str, Any], pass_threshold: float = 1.0) -> str:
    g = m.get
    at = "" if pass_threshold == 1.0 else f"(>={pass_threshold:g})"
    return (
        f"step {step:>3} reward {g('reward/mean', 0):+.2f} pass{at} {g('reward/pass_rate', 0):.2f}"
        f" len {g('rollout/completion_len', 0):3.0f} H80 {g('entropy/p80', 0):.2f}"
        f" fork {g('entropy/tokens_selected', 0)}/{g('entropy/tokens_policy', 0)}"
        f" groups {g('rollout/groups_informative', 0)}/{g('rollout/groups', 0)}"
        f" gen {g('time/generate', 0):.0f}s train {g('time/train', 0):.0f}s"
        + _reused(g("rollout/reused"))
    )


def _reused(n: float | None) -> str:
    """Rollouts a step took from the ledger (a resumed run's), never silently."""
    return f" reused {n:.0f} rollouts from the ledger" if n else ""


class GrpoObjective(Trainer):
    """`rldojo train`'s objective."""

    command = "train"
    kind = "train"
    summary_keys = ("model", "env", "steps", "accuracy_before", "accuracy_after", "mean_step_s",
                    "wall_s", "rollouts", "rollouts_trained", "statuses", "run_dir")  # fmt: skip

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False,
                 dist: Dist | None = None) -> None:  # fmt: skip
        super().__init__(config, run_dir, resume=resume, dist=dist)
        self.total_steps = self.config.run.steps
        self.watch = signal_watch(self.config, self.envs)  # says why a step had no signal

    def header(self) -> list[str]:
        cfg = self.config
        clip = clip_note(cfg)  # said once: the clip-higher bound does nothing here
        return [
            f"[bold]rldojo train[/] {cfg.model.name} on {cfg.env.id} -> {self.run_dir}",
            f"precision: {self.precision.describe()}",
            f"threads: {self.threads.describe()}",
            f"device: {self.device} (run.device = {cfg.run.device!r}); {trainable(self.model)}",
            *describe_recipe(cfg),
            *([f"note: {clip}"] if clip else []),
        ]

    def preflight(self) -> RunStopped | None:
        """The grader on the reference answers (rank 0; every rank gets its verdict)."""
        if self.config.run.max_failure_rate >= 1.0:
            return None
        return self.dist.broadcast(self.grader_preflight() if self.dist.main else None)

    def evaluates(self, label: str) -> bool:
        tasks = self.config.eval.tasks > 0
        return tasks and (label != "before" or self.config.eval.before)

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        if self.ledger is None:  # not rank 0: it writes the samples and says why
            return []
        with (self.run_dir / "samples.jsonl").open("a") as f:
            for row in self.ledger.samples(self.step_num - 1):
                f.write(json.dumps({"step": self.step_num, **row}) + "\n")
        why = self.watch.observe(self.step_num, metrics)
        return [] if why is None else [why]

    def step_line(self, step: int, metrics: dict[str, Any]) -> str:
        return step_line(step, metrics, self.pass_threshold)

    def summary(self) -> dict[str, Any]:
        if self.ledger is None:  # not rank 0, which writes the summary
            return {"model": self.config.model.name, "env": self.config.env.id}
        steps = self.ledger.step_metrics()
        step_times = [m["time/step"] for m in steps if "time/step" in m]
        return {
            "model": self.config.model.name,
            "env": self.config.env.id,
            "mean_step_s": sum(step_times) / len(step_times) if step_times else None,
            "rollouts": self.ledger.count(),
            "rollouts_trained": self.ledger.count(trained=True),
            "statuses": self.ledger.status_counts(),
            "no_signal": [found.as_dict() for found in self.watch.report(steps)],
            "precision": self.precision.as_dict(),
            "device": str(self.device),
            "threads": self.threads.as_dict(),
        }


def trainable(model: Any) -> str:
    """'full fine-tuning, N parameters' or 'LoRA: N of M parameters train'."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trained == total:
        return f"full fine-tuning, {total / 1e6:.1f}M parameters"
    return f"LoRA: {trained / 1e6:.2f}M of {total / 1e6:.1f}M parameters train"
