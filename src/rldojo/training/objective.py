"""What a run trains towards: the part of a run that differs between RL, SFT and distillation.

A run is resources (`rldojo.training.run.Run`: device, precision, threads, environments
and grader, the model with its optional LoRA, the sampler, the optimizer and schedule,
evaluations, checkpoints; built once for every objective), a loop
(`rldojo.training.loop`: steps, evaluations, checkpoints and resume, budgets, interrupts,
callbacks) and an objective:

    grpo     rollouts -> forking-token mask -> clipped policy loss   (`rldojo.training.grpo`)
    sft      demonstrations -> assistant-token NLL                   (`rldojo.training.sft`)
    distill  teacher sequences or the student's -> token KL          (`rldojo.training.distill`)

An objective is what differs: its checks and data, its next batch and loss (one optimizer
step at a time), its state to save and what it says. It is built on a `Run`: its
constructor checks its own inputs, calls `run.load()` (the model), prepares its data and
sets `total_steps`, then calls `run.start(self)` (the optimizer; a resumed run's state,
given back through `load_state_dict`). A fourth objective is one such class
(`tests/dpo_objective.py` is one: DPO on preference pairs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rldojo.training.run import Run
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

    run: Run
    """What it trains with; the step count, evaluations and checkpoints are the run's."""
    total_steps: int
    """Steps the run trains to in all."""

    def header(self) -> list[str]:
        """The lines that open the run: what trains on what, where; precision, threads."""
        ...

    def preflight(self) -> RunStopped | None:
        """Before the first step of a new run: the stop when the run cannot learn."""
        ...

    def step(self) -> dict[str, Any]:
        """One optimizer step at `run.step_num` (the loop then advances the schedule and
        the count: `run.finish_step`); its metrics."""
        ...

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        """What the step's metrics say to a person (diagnoses); extra step files."""
        ...

    def step_line(self, step: int, metrics: dict[str, Any]) -> str:
        """The console's line for a step."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it besides the run's (weights, optimizer, schedule,
        RNG, step, evaluations): its data position, its counters."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run's checkpoint state (`state_dict`'s keys, and "step")."""
        ...

    def summary(self) -> dict[str, Any]:
        """The objective's part of `summary.json`."""
        ...

    def close(self) -> None:
        """Its own resources (the run closes its own after it)."""
        ...
