"""A GRPO run driven by hand: one step at a time, without the loop.

`Trainer(config, run_dir)` builds a run (`rldojo.training.run.Run`) and its GRPO
objective (`rldojo.training.grpo.GrpoObjective`) as `rldojo train` does, and
`trainer.step()` takes one step as the loop takes it (the objective's step, then the
schedule and the step count). No evaluation, checkpoint, log line or summary happens
unless asked for (`trainer.evaluate(label)`, `trainer.save()`). Tests, benchmarks and
notebooks use it to look inside a run:

    trainer = Trainer(load_config(None, ["model.name=tiny-random"]), Path("runs/x"))
    metrics = trainer.step()
    trainer.model, trainer.ledger, trainer.policy_updates
    trainer.close()

An attribute is the objective's when it has it (`ledger`, `experience`, `update`,
`train_on`, `policy_updates`), else the run's (`model`, `tokenizer`, `optimizer`,
`policy`, `config`, `step_num`, `evals`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig
from rldojo.eval.harness import EvalResult
from rldojo.rollout.episodes import TurnProgress
from rldojo.training.distributed import Dist
from rldojo.training.grpo import GrpoObjective
from rldojo.training.run import Run

__all__ = ["Trainer"]


class Trainer:
    """A GRPO run and its objective, stepped by hand."""

    def __init__(
        self, config: TrainConfig, run_dir: Path, *, resume: bool = False, dist: Dist | None = None
    ) -> None:
        self.run = Run(config, run_dir, resume=resume, dist=dist)
        try:
            self.objective = GrpoObjective(self.run)
        except BaseException:
            self.run.close()
            raise

    def __getattr__(self, name: str) -> Any:
        """The objective's attribute, else the run's (see the module docstring)."""
        if name in ("run", "objective"):  # not built (a failed constructor)
            raise AttributeError(name)
        objective = self.objective
        if hasattr(objective, name):
            return getattr(objective, name)
        return getattr(self.run, name)

    def step(self) -> dict[str, Any]:
        """One step, as the loop takes it; its metrics."""
        metrics = self.objective.step()
        self.run.finish_step()
        return metrics

    def evaluate(self, label: str, progress: TurnProgress | None = None) -> EvalResult | None:
        return self.run.evaluate(label, progress)

    def save(self) -> Path:
        """A checkpoint of the step reached."""
        return self.run.save(self.objective.state_dict())

    def close(self) -> None:
        try:
            self.objective.close()
        finally:
            self.run.close()
