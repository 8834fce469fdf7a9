"""What a run trains towards: the part of a run that differs between RL, SFT and distillation.

A run is resources (device, precision, threads, the model with its optional LoRA, the
optimizer and its schedule, the data position), a loop (`rldojo.training.loop`: steps,
evaluations, checkpoints and resume, budgets, interrupts, callbacks) and an objective:

    grpo     rollouts -> forking-token mask -> clipped policy loss   (`rldojo.training.grpo`)
    sft      demonstrations -> assistant-token NLL                   (`rldojo.training.sft`)
    distill  teacher sequences or the student's -> token KL          (`rldojo.training.distill`)

An objective owns its resources, is built with the run's checkpoint when it resumes (the
weights, optimizer, scheduler, RNG and data position of `rldojo.store.checkpoint`), and
does one optimizer step at a time; the loop does everything else the same way for all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rldojo.eval.harness import EvalResult
from rldojo.rollout.episodes import TurnProgress
from rldojo.training.stops import RunStopped

__all__ = ["Objective"]


class Objective(Protocol):
    @property
    def command(self) -> str:
        """The CLI command that runs it ("train", "sft", "distill"): messages name it."""
        ...

    @property
    def kind(self) -> str:
        """The `kind` of its step records in `metrics.jsonl` ("train", "sft", "distill")."""
        ...

    @property
    def over_budget(self) -> RunStopped | None:
        """Set by a step that spent the failure budget: the loop raises it after logging."""
        ...

    @property
    def summary_keys(self) -> Sequence[str]:
        """The summary's keys a console shows, in order."""
        ...

    run_dir: Path
    step_num: int
    """Optimizer steps done (a resumed run starts at its checkpoint's)."""
    total_steps: int
    """Steps the run trains to in all."""
    evals: dict[str, dict[str, Any]]
    """The evaluations so far, by label (kept in checkpoints)."""

    def header(self) -> list[str]:
        """The lines that open the run: what trains on what, where; precision, threads."""
        ...

    def preflight(self) -> RunStopped | None:
        """Before the first step of a new run: the stop when the run cannot learn."""
        ...

    def evaluates(self, label: str) -> bool:
        """Whether the run evaluates `label` ("before", "after", "every")."""
        ...

    def step(self) -> dict[str, Any]:
        """One optimizer step; its metrics (`step_num` advanced)."""
        ...

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        """What the step's metrics say to a person (diagnoses); extra step files."""
        ...

    def step_line(self, step: int, metrics: dict[str, Any]) -> str:
        """The console's line for a step."""
        ...

    def evaluate(self, label: str, progress: TurnProgress | None = None) -> EvalResult | None:
        """The held-out evaluation, recorded in `evals` under `label` (None on the ranks
        that do not evaluate: rank 0 does, and gives the others its record); `progress`
        hears how far each turn of its episodes got."""
        ...

    def save(self) -> Path:
        """A checkpoint of everything a resume needs; its directory."""
        ...

    def summary(self) -> dict[str, Any]:
        """The objective's part of `summary.json`."""
        ...

    def close(self) -> None: ...
