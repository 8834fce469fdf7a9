"""A run's resources, built once for every objective.

A run is these resources, a loop (`rldojo.training.loop`) and an objective
(`rldojo.training.objective`: GRPO, SFT, distillation, or one of your own). `Run` holds
what every objective trains with, in the order it is built:

1. `Run(config, run_dir, ...)`: the machine's settings resolved (precision, threads,
   device), the seeds, and the run's inputs checked: trackers, environment ids and
   kwargs, data files, the grader spec. The environments, their grader and pass
   threshold. (The objective checks its own inputs next: demonstrations, a teacher.)
2. `load()`: the model name, LoRA's needs and sharding checked, then RUN/config.toml
   (rank 0, atomically: a run killed after this resumes; nothing is written before), the
   trained model and tokenizer (LoRA included), sharded across the ranks (each rank
   reads only its shards: `rldojo.training.sharded_load`), and the sampler
   held-out evaluations and rollouts generate with (`policy`; sharded, rank 0 samples from
   a whole copy, `gen_model`, that `publish` refreshes).
3. `start(objective)`: the optimizer (AdamW, `[optim]`) and its schedule over the
   objective's `total_steps`, then the checkpoint of a resumed run: weights and optimizer
   were loaded, here the step, the evaluations and the objective's own state.

Then, for the loop: `evaluate` (the held-out evaluation, `[eval]`), `finish_step` (the
schedule, the step count), `save` (a checkpoint on every rank) and `close`. An objective
calls `load` and `start` from its constructor, between its own checks and data, and
`optimizer_step`, `publish` and `frozen_copy` as its step needs them.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rldojo.config import TrainConfig, dump_config
from rldojo.eval.harness import EvalResult
from rldojo.graders.base import close_grader
from rldojo.policy.base import ClosablePolicy, Policy, Tokenizer
from rldojo.policy.lora import trainable_parameters
from rldojo.policy.models import check_model, load_model
from rldojo.policy.training_model import (
    check_training_model,
    make_policy,
)
from rldojo.report.trackers import check_report_to
from rldojo.rollout.episodes import TurnProgress
from rldojo.rollout.mixture import EnvMixture
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.store.files import write_atomically
from rldojo.training.distributed import (
    Dist,
    check_shardable,
    gather_into,
    rank_device,
)
from rldojo.training.heldout import eval_record, heldout_eval, heldout_tasks
from rldojo.training.inputs import build_mixture, pass_threshold
from rldojo.training.rank_checkpoints import restore_trainer_state, save_on_ranks
from rldojo.training.resources import resolve_resources, seed_everything
from rldojo.training.sharded_load import load_sharded, load_sharded_frozen, sharded_reference
from rldojo.training.update import adamw_with_schedule, clipped_step, release_freed_memory
from rldojo.types import SamplingParams

if TYPE_CHECKING:
    from rldojo.training.objective import Objective

__all__ = ["Run"]


class Run:
    """What every objective trains with: config, ranks, device, environments and grader,
    model, tokenizer, sampler, optimizer, step count, evaluations, checkpoints."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        dist: Dist | None = None,
        tasks: bool = True,
    ) -> None:
        """Resolve and check (nothing is written or loaded). `tasks`: the objective draws
        training tasks from `[env]`; else the environments are built only to evaluate
        (`eval.tasks` > 0)."""
        self.dist = dist or Dist()
        # "auto" precision and threads resolved for this machine; config.toml records them.
        self.config, self.precision, self.threads = resolve_resources(config)
        cfg = self.config
        self.run_dir, self.resume = run_dir, resume
        seed_everything(cfg.run.seed, cfg.run.deterministic)
        check_report_to(cfg.run.report_to)  # a tracker's package is missing
        self.mixture: EnvMixture | None = None
        self.pass_threshold = 1.0
        if tasks or cfg.eval.tasks > 0:
            self.mixture = build_mixture(cfg)  # env ids, kwargs, data files, grader spec
            self.pass_threshold = pass_threshold(cfg, self.mixture)
        self.grader = self.mixture.grader() if self.mixture is not None else None
        self.checkpoint = latest_checkpoint(run_dir / "checkpoints") if resume else None
        self.device = rank_device(self.precision.device, self.dist)  # run.device, resolved
        self.step_num = 0
        """Optimizer steps done (a resumed run starts at its checkpoint's)."""
        self.evals: dict[str, dict[str, Any]] = {}
        """The evaluations so far, by label (kept in checkpoints)."""
        self.model: torch.nn.Module  # `load` loads them
        self.tokenizer: Tokenizer
        self.gen_model: torch.nn.Module | None = None  # rank 0's sampler's weights
        self.policy: Policy | None = None  # rank 0's sampler
        self.sampled = False  # whether rank 0 has a sampler (the same on every rank)
        self.sampler_stale = False  # the sampler's copy lags the trained weights
        # One event loop for the run's life: grader worker pools bind to it.
        self.loop = asyncio.new_event_loop()

    def evaluates(self, label: str) -> bool:
        """Whether the run evaluates `label` ("before", "after", "every"): `eval.tasks`,
        and `eval.before` for "before"."""
        e = self.config.eval
        return e.tasks > 0 and (label != "before" or e.before)

    # ------------------------------------------------------------------ build

    def load(self, *, sampler: bool = True) -> None:
        """The model's checks (its name, LoRA's needs, sharding), RUN/config.toml, then the
        trained model and tokenizer, sharded across the ranks,
        and rank 0's sampler: made when the objective samples (`sampler`) or the run
        evaluates. Sharded, the sampler generates from a whole copy on rank 0."""
        cfg = self.config
        if self.checkpoint is None or cfg.loss.kl_coef > 0:  # a reference loads the base
            check_model(cfg.model.name)
        check_training_model(cfg.model, self.checkpoint, cfg.run.cluster)  # LoRA's needs
        check_shardable(cfg, self.dist, self.device)
        if self.dist.main:  # first, and atomically: a run killed later can be resumed
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(self.run_dir / "config.toml", dump_config(cfg))
        wanted = sampler or cfg.eval.tasks > 0
        loaded = load_sharded(
            cfg.model,
            self.checkpoint,
            self.dist,
            self.device,
            bf16=cfg.model.autocast_bf16 is True,
            offload=cfg.run.cpu_offload,
            load=lambda name: load_model(name),  # late-bound: tests replace `load_model` here
            whole=wanted,
        )  # sharded: each rank reads only its shards; rank 0 also a whole copy to sample
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.sampled = wanted  # on every rank: whether rank 0 has a sampler (and its copy)
        self.gen_model = loaded.whole
        if self.gen_model is not None:  # rank 0 alone samples when sharded
            gen_dtype = self.precision.torch_generation_dtype()
            self.policy = make_policy(cfg, self.gen_model, self.tokenizer, gen_dtype)

    def reference(self) -> torch.nn.Module:
        """The initial model, frozen, sharded like the trained one (the KL reference):
        the base loaded again after a resume or under LoRA."""
        return sharded_reference(
            self.config.model,
            self.model,
            self.checkpoint,
            self.dist,
            self.device,
            bf16=self.config.model.autocast_bf16 is True,
            offload=self.config.run.cpu_offload,
            load=lambda name: load_model(name),
        )

    def frozen(self, name: str, *, whole_copy: bool = False) -> tuple[Any, Any, Any]:
        """Another model (a teacher), frozen on the run's device and sharded like the
        trained one; `(model, tokenizer, whole)`: `whole` a whole copy on rank 0 when
        `whole_copy` (sharded; else the model itself), for sampling from."""
        model, tokenizer, whole = load_sharded_frozen(
            name,
            self.dist,
            self.device,
            bf16=self.config.model.autocast_bf16 is True,
            offload=self.config.run.cpu_offload,
            load=lambda name: load_model(name),
            whole=whole_copy or not self.dist.sharded,
        )
        return model, tokenizer, whole

    def start(self, objective: Objective) -> dict[str, Any]:
        """AdamW over the trained parameters (the adapters alone under LoRA) and the
        schedule over `objective.total_steps`; a resumed run's step, evaluations and
        optimizer state. Returns the checkpoint's state ({} for a new run), after
        `objective.load_state_dict` took its part."""
        o = self.config.optim
        self.params = trainable_parameters(self.model)
        self.optimizer, self.scheduler = adamw_with_schedule(
            self.params, o, lr=o.lr, warmup=o.warmup_steps, total=objective.total_steps
        )
        if self.checkpoint is None:
            return {}
        # the optimizer's state by parameter name: any world size
        state = restore_trainer_state(
            self.checkpoint, self.model, self.optimizer, self.scheduler, self.dist
        )
        self.step_num, self.evals = int(state["step"]), state.get("evals", {})
        objective.load_state_dict(state)
        return state

    # ------------------------------------------------------------------ steps

    def optimizer_step(self) -> tuple[float, bool]:
        """Clip (`optim.grad_clip`) and step, unless the gradient is not finite; the
        gradients cleared. Returns (the norm before clipping, whether it stepped)."""
        norm, stepped = clipped_step(self.optimizer, self.params, self.config.optim.grad_clip)
        self.optimizer.zero_grad(set_to_none=True)
        self.sampler_stale = True
        return float(norm), stepped

    def publish(self) -> None:
        """The trained weights to the sampler (sharded: gathered into rank 0's copy)."""
        if self.dist.sharded:  # collective: every rank sends its shards
            lora = self.config.model.lora is not None
            gather_into(self.model, self.gen_model, self.dist, adapters_only=lora)
        if self.policy is not None:
            self.policy.update_weights()
        self.sampler_stale = False

    def finish_step(self) -> None:
        """After an objective's step: the schedule advances (also when the step skipped its
        update) and the step is counted."""
        with warnings.catch_warnings():  # a skipped update still advances the schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        self.step_num += 1

    def sampling(self, seed: int | None = None) -> SamplingParams:
        """`[sampling]` as training episodes sample, with `seed`."""
        s = self.config.sampling
        return SamplingParams(s.max_new_tokens, s.temperature, s.top_p, tuple(s.stop), seed)

    @property
    def pad_id(self) -> int:
        """The id batches are padded with (the tokenizer's padding token)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else 0

    def lr(self) -> float:
        """The learning rate of the step being taken."""
        return float(self.scheduler.get_last_lr()[0])

    # ------------------------------------------------------------------ the loop's

    def evaluate(self, label: str, progress: TurnProgress | None = None) -> EvalResult | None:
        """Greedy accuracy on the held-out tasks, recorded in `evals` under `label`.
        Rank 0 evaluates, on the sampler given the current weights; the other ranks get
        its record (None is their result)."""
        if self.sampler_stale:
            self.publish()
        result = None
        if self.dist.main:
            assert self.policy is not None and self.mixture is not None and self.grader
            # glibc keeps the steps' freed heap (16-18.5 GiB after SFT on web-crm-v1's
            # 2,000-token episodes); the evaluation's browsers need it.
            release_freed_memory()
            tasks = heldout_tasks(self.config, self.mixture.test_tasks, label)
            result = heldout_eval(
                self.config,
                self.mixture.make_env_for,
                self.grader,
                self.policy,
                tasks,
                self.pass_threshold,
                self.loop,
                progress,
            )
        record = eval_record(result) if result is not None else None
        self.evals[label] = self.dist.broadcast(record)
        return result

    def save(self, state: dict[str, Any]) -> Path:
        """A checkpoint of step `step_num` (every rank calls it; rank 0 finishes it): whole
        weights in the Hugging Face layout and the optimizer's state by parameter name, or
        each rank's shards of both (`run.checkpoint_format = "dcp"`); any world size
        resumes it. `state`: the objective's, kept beside the evaluations."""
        # Sharded, rank 0's sampler copy is written whole when it holds the current
        # weights; else they are gathered (a collective: every rank decides alike).
        current = self.sampled and not self.sampler_stale
        writer = self.gen_model if self.dist.sharded and current else self.model
        state = {**state, "evals": self.evals, "world_size": self.dist.world}
        return save_on_ranks(
            self.run_dir / "checkpoints",
            self.step_num,
            model=self.model,
            writer=writer,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=state,
            d=self.dist,
            files=self.config.run.checkpoint_format,
            gather=not (self.dist.sharded and current),
            by_name=True,
        )

    def close(self) -> None:
        """The sampler's and the grader's resources, then the event loop."""
        if isinstance(self.policy, ClosablePolicy):
            self.policy.close()  # vLLM: its weights snapshot
        if self.grader is not None:
            self.loop.run_until_complete(close_grader(self.grader))
        self.loop.close()
