"""The trainer: GRPO-family policy gradient where only forking tokens carry gradient.

`Trainer.step()` is the whole data flow, top to bottom:

    graded groups from the rollout source (`rldojo.rollout.sources`: draw tasks -> roll
    out G samples per task -> grade -> ledger (durable) -> refill groups without signal)
    -> drop groups without signal (dynamic sampling; else a partial batch)
    -> group advantages -> token entropy -> top-ρ forking-token mask
    -> micro-batched clipped loss with gradient accumulation -> AdamW step
    -> new weights to the policy -> metrics

Grader and environment failures arrive here as statuses; they are counted and excluded
from the gradient (a failed sample is neither a 0 reward nor a group member).
"""

from __future__ import annotations

import asyncio
import copy
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig, dump_config
from rldojo.envs.base import Env
from rldojo.eval.harness import EvalResult
from rldojo.policy.lora import trainable_parameters
from rldojo.policy.models import check_model, load_model
from rldojo.policy.training_model import (
    check_training_model,
    load_reference,
    load_training_model,
    make_policy,
)
from rldojo.policy.vllm_backend import check_vllm
from rldojo.report.trackers import check_report_to
from rldojo.rollout.env_pool import EnvWorkerPool
from rldojo.rollout.episodes import TurnProgress
from rldojo.rollout.generation import Generation, LocalGeneration, RayGeneration, Rounds
from rldojo.rollout.groups import Collected, Group
from rldojo.rollout.sources import RolloutSource, make_source
from rldojo.rollout.tasks import TaskSampler
from rldojo.store.checkpoint import latest_checkpoint
from rldojo.store.files import write_atomically
from rldojo.store.ledger import Ledger
from rldojo.training import rollout_workers
from rldojo.training.distributed import (
    Dist,
    check_shardable,
    gather_into,
    rank_device,
    shard_model,
)
from rldojo.training.failures import FailureBudget, reference_preflight
from rldojo.training.group_batch import group_batch
from rldojo.training.heldout import eval_record, heldout_eval, heldout_tasks
from rldojo.training.preflight import (
    build_curriculum,
    build_mixture,
    env_entries,
    pass_threshold,
)
from rldojo.training.rank_checkpoints import restore_trainer_state, save_on_ranks
from rldojo.training.resources import resolve_resources, seed_everything
from rldojo.training.step_metrics import rollout_metrics
from rldojo.training.stops import FailureBudgetExceeded
from rldojo.training.update import (
    PolicyUpdate,
    adamw_with_schedule,
    release_freed_memory,
    token_advantages,
)
from rldojo.types import SamplingParams, Task


class Trainer:
    """Owns the model, optimizer, policy, environment, grader, ledger and run directory."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False,
                 dist: Dist | None = None) -> None:  # fmt: skip
        """`dist`: this process's rank (`rldojo.training.distributed`); sharded, rank 0
        rolls out, grades and keeps the ledger and every rank trains on its groups."""
        self.dist = dist or Dist()
        # "auto" precision and threads resolved for this machine; config.toml records them.
        self.config, self.precision, self.threads = resolve_resources(config)
        cfg = self.config
        self.run_dir = run_dir
        seed_everything(cfg.run.seed, cfg.run.deterministic)
        # Everything that can be wrong with the input is found before the run directory
        # exists or a model loads: environment ids and kwargs, data files, the grader
        # spec, the trackers' packages here, the model name just below.
        check_report_to(cfg.run.report_to)  # a tracker's package is missing
        entries = env_entries(cfg)
        self.envs = build_mixture(cfg)
        self.grader = self.envs.grader()
        self.pass_threshold = pass_threshold(cfg, self.envs)
        self.test_tasks = self.envs.test_tasks
        self.curriculum = build_curriculum(cfg, self.envs, self.pass_threshold)
        self.tasks = TaskSampler(self.envs, self.curriculum, seed=cfg.run.seed)
        checkpoint = latest_checkpoint(run_dir / "checkpoints") if resume else None
        if checkpoint is None or cfg.loss.kl_coef > 0:  # the KL reference loads the base
            check_model(cfg.model.name)
        check_training_model(cfg.model, checkpoint, cfg.run.cluster)  # LoRA's needs
        check_vllm(cfg)  # generation.backend = "vllm": its package and settings
        self.device = rank_device(self.precision.device, self.dist)  # run.device, resolved
        check_shardable(cfg, self.dist, self.device)
        if self.dist.main:  # first, and atomically: a run killed later can be resumed
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(run_dir / "config.toml", dump_config(cfg))
        self._models(checkpoint)
        self._rollout_side(entries)
        self.optimizer, self.scheduler = adamw_with_schedule(
            trainable_parameters(self.model),  # the adapters alone under LoRA
            cfg.optim, lr=cfg.optim.lr, warmup=cfg.optim.warmup_steps, total=cfg.run.steps,
        )  # fmt: skip
        self.update = PolicyUpdate(self.model, self.ref_model, self.optimizer, cfg, self.dist)
        self._restore(checkpoint, resume)
        self._selection: dict[int, tuple[float, list[int]]] = {}  # of the last train_on
        self.failures = FailureBudget(cfg.run.max_failure_rate, cfg.run.failure_window)
        self.over_budget: FailureBudgetExceeded | None = None  # the loop raises it
        if self.ray_pool is not None:
            self.ray_pool.publish(self.gen_model, self.policy_updates)
        # One event loop for the trainer's life: grader worker pools bind to it.
        self._loop = asyncio.new_event_loop()

    def _models(self, checkpoint: Path | None) -> None:
        """The trained model, its KL reference (the initial model, also after a resume)
        and the sampler. Sharded: both models split across the ranks, and rank 0 samples
        from a whole copy (`gen_model`) that each update's gathered weights refresh."""
        cfg = self.config
        self.model, self.tokenizer = load_training_model(
            cfg.model, checkpoint, self.device, lambda name: load_model(name)
        )  # late-bound: tests replace `load_model` here
        self.ref_model = None
        if cfg.loss.kl_coef > 0:
            self.ref_model = load_reference(
                cfg.model, self.model, checkpoint, self.device, lambda name: load_model(name)
            )
        self.gen_model = self.model
        if self.dist.sharded:
            self.gen_model = copy.deepcopy(self.model) if self.dist.main else None
            bf16 = cfg.model.autocast_bf16 is True
            for model in (self.model, self.ref_model):
                if model is not None:
                    shard_model(model, self.dist, self.device, bf16, offload=cfg.run.cpu_offload)
        self.policy = None  # rank 0 alone samples when sharded
        if self.gen_model is not None:
            gen_dtype = self.precision.torch_generation_dtype()
            self.policy = make_policy(cfg, self.gen_model, self.tokenizer, gen_dtype)

    def _rollout_side(self, entries: list) -> None:
        """Environment and grader workers, Ray rollout workers, the generation rounds and
        the ledger: rank 0's alone when sharded (the others get its groups)."""
        cfg = self.config
        self.source: RolloutSource | None = None  # started by the first step
        self.grader_pool: EnvWorkerPool | None = None  # graders in workers (own timeout)
        self.env_pool: EnvWorkerPool | None = None
        self.ray_pool = None
        self.ledger: Ledger | None = None
        if not self.dist.main:
            return
        self.env_pool = rollout_workers.env_pool(cfg)
        if cfg.rollout.grade_in_workers:
            self.grader_pool, self.grader = rollout_workers.remote_graders(cfg, self.envs)
        if cfg.run.cluster == "ray":
            self.ray_pool = rollout_workers.ray_pool(cfg, entries)
        assert self.policy is not None  # rank 0 samples
        generation: Generation = (
            LocalGeneration(self.make_env, self.policy, self.grader, cfg.rollout)
            if self.ray_pool is None  # else generation, envs and grading on Ray actors
            else RayGeneration(self.ray_pool, cfg.rollout.group_size, lambda: self.policy_updates)
        )
        self.rounds = Rounds(self.tasks, generation, cfg.rollout, self.sampling)
        self.ledger = Ledger(self.run_dir / "ledger.sqlite")

    def _restore(self, checkpoint: Path | None, resume: bool) -> None:
        """The step, draw position, evaluations, optimizer and schedule of `checkpoint`
        (the optimizer's state by parameter name: any world size); the ledger rolled back
        to it on a resume."""
        self.step_num = 0
        self.policy_updates = 0  # weight updates so far (the trainer's policy version)
        self.async_next_batch = 0  # the async producer's next batch (continues on resume)
        self.evals: dict[str, dict[str, Any]] = {}
        if checkpoint is not None:
            state = restore_trainer_state(checkpoint, self.model, self.optimizer,
                                          self.scheduler, self.dist)  # fmt: skip
            self.step_num, self.evals = state["step"], state.get("evals", {})
            self.tasks.load_state_dict(state)
            self.async_next_batch = int(state.get("async_next_batch", 0))
            self.policy_updates = state.get("policy_version", self.step_num)
            if self.policy is not None:
                self.policy.version = self.policy_updates
        if resume and self.ledger is not None:
            self.ledger.rollback(self.step_num)  # training after the checkpoint was lost

    # ------------------------------------------------------------------ the flow

    def step(self) -> dict[str, Any]:
        """One optimizer step: collect informative groups, then train on them. Sharded,
        rank 0 collects and every rank trains on its share of the same groups."""
        started = time.perf_counter()
        collected = None
        metrics: dict[str, Any] = {}
        trained: list[Group] = []
        if self.dist.main:
            collected = self.rollout_source().collect(self.step_num, self.policy_updates)
            metrics, trained = self._signal(collected)
        trained = self.dist.broadcast(trained)
        timing = {} if collected is None else collected.timing
        if trained:
            t0 = time.perf_counter()
            release_freed_memory()  # what generation freed, before the gradients are made
            metrics |= self.train_on(trained)
            timing["time/train"] = time.perf_counter() - t0
            if self.ledger is not None:
                ids = [i for g in trained for i in g.ledger_ids]
                self.ledger.mark_trained(ids, self.step_num + 1, self._selection)
        else:
            metrics["train/skipped"] = 1  # no signal in any group: no update this step
        self.step_num += 1
        over = None if collected is None else self.failures.observe(
            self.step_num, collected.rollouts, collected.scores)  # fmt: skip
        self.over_budget = self.dist.broadcast(over)  # every rank stops with rank 0
        with warnings.catch_warnings():  # a skipped update still advances the LR schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        if collected is not None:
            self._log_step(metrics, collected, started)
        return metrics

    def _signal(self, collected: Collected) -> tuple[dict[str, Any], list[Group]]:
        """The rollouts' metrics and the groups to train on: informative ones, at most
        `rollout.prompts_per_step` (the rest are counted, untrained)."""
        groups = collected.groups
        metrics = rollout_metrics(collected.rollouts, collected.scores, groups,
                                  self.config.rollout, self.pass_threshold)  # fmt: skip
        metrics["rollout/extra_rounds"] = collected.rounds
        informative = [g for g in groups if g.informative]
        trained = informative[: self.config.rollout.prompts_per_step]
        metrics["rollout/groups_surplus"] = len(informative) - len(trained)
        return metrics, trained

    def _log_step(self, metrics: dict[str, Any], collected: Collected, started: float) -> None:
        """The step's timings, rates and worker metrics into `metrics`, then the ledger."""
        timing = collected.timing
        timing["time/step"] = time.perf_counter() - started
        n_tokens = sum(len(r.completion_ids) for r in collected.rollouts)
        metrics |= timing | {
            "time/tokens_per_s_generate": n_tokens / max(timing["time/generate"], 1e-9)
        }
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        metrics |= collected.task_metrics  # taken by the sampler's own thread (see sources)
        if self.env_pool is not None:
            metrics |= self.env_pool.metrics()
        if self.grader_pool is not None:
            metrics |= {f"grade/workers_{k.split('/')[1]}": v
                        for k, v in self.grader_pool.metrics().items()}  # fmt: skip
        assert self.ledger is not None
        self.ledger.add_step(self.step_num, metrics)

    def rollout_source(self) -> RolloutSource:
        """The source of graded groups (`rldojo.rollout.sources`), started on first use:
        after a resume has restored the draw position, and after the "before" evaluation
        (an asynchronous producer would otherwise generate alongside it)."""
        if self.source is None:
            assert self.ledger is not None  # rank 0's
            self.source = make_source(
                self.rounds, self.config.rollout, self.ledger, self._loop,
                seed=self.config.run.seed, next_batch=self.async_next_batch,
                step=lambda: self.step_num,
            )  # fmt: skip
        return self.source

    def train_on(self, groups: Sequence[Group]) -> dict[str, Any]:
        """Advantages -> entropy -> forking-token mask (`rldojo.training.group_batch`) ->
        accumulated loss -> optimizer step -> the new weights to the sampler."""
        gb = group_batch(groups, self.config, self.tokenizer.pad_token_id, self.update.entropy,
                         self.step_num)  # fmt: skip
        self._selection = gb.selection()
        token_adv = token_advantages(gb.advantages, gb.scores, gb.batch.policy_mask.shape[1])
        metrics = self.update.optimize(gb.batch, token_adv, gb.selected, self.policy_updates)
        published = time.perf_counter()
        self._publish()
        metrics["time/update_weights"] = time.perf_counter() - published  # to the sampler
        return metrics | gb.metrics(self.config, self.tokenizer)

    def _publish(self) -> None:
        """The new weights to the sampler (sharded: gathered into rank 0's whole copy)
        and the Ray rollout workers; the policy version += 1."""
        if self.dist.sharded:
            lora = self.config.model.lora is not None
            gather_into(self.model, self.gen_model, self.dist, adapters_only=lora)
        if self.policy is not None:
            self.policy.update_weights()
        self.policy_updates += 1
        if self.ray_pool is not None:  # here, not in a rollout thread: the optimizer is idle
            self.ray_pool.publish(self.gen_model, self.policy_updates)

    # ------------------------------------------------------------------ helpers

    def make_env(self, task: Task) -> Env:
        if self.env_pool is not None:
            slot = self.envs.slot_for(task)
            return self.env_pool.make_env(slot.env_id, slot.kwargs)
        return self.envs.make_env_for(task)

    def sampling(self, seed: int | None = None) -> SamplingParams:
        s = self.config.sampling
        return SamplingParams(s.max_new_tokens, s.temperature, s.top_p, tuple(s.stop), seed)

    def grader_preflight(self) -> FailureBudgetExceeded | None:
        """The stop when the grader fails on every reference answer (`train.failures`)."""
        return reference_preflight(self.envs, self.grader, self._loop,
                                   timeout_s=self.config.rollout.grade_timeout_s)  # fmt: skip

    def evaluate(self, label: str, progress: TurnProgress | None = None) -> EvalResult | None:
        """Greedy accuracy on the held-out tasks; stored under `label` in the run state.
        Sharded, rank 0 evaluates (its sampler's copy holds the current weights) and the
        others get the record (None is their result)."""
        result = None
        if self.policy is not None:  # rank 0
            tasks = heldout_tasks(self.config, self.test_tasks, label)
            result = heldout_eval(self.config, self.make_env, self.grader, self.policy,
                                  tasks, self.pass_threshold, self._loop, progress)  # fmt: skip
        record = eval_record(result) if result is not None else None
        self.evals[label] = self.dist.broadcast(record)
        return result

    def save(self) -> Path:
        """A checkpoint (rank 0 finishes it): whole weights in the Hugging Face layout and,
        sharded, the optimizer's state by parameter name, or each rank's shards of both
        (`run.checkpoint_format = "dcp"`); any world size resumes it."""
        # rank 0's sampler copy holds the current weights whole: nothing to gather
        return save_on_ranks(self.run_dir / "checkpoints", self.step_num, model=self.model,
                             writer=self.gen_model, tokenizer=self.tokenizer,
                             optimizer=self.optimizer, scheduler=self.scheduler,
                             state=self._run_state(), d=self.dist,
                             files=self.config.run.checkpoint_format, gather=False)  # fmt: skip

    def _run_state(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the tensors: the draw position, evaluations,
        the policy version."""
        if self.source is None:
            draws = self.tasks.state_dict()
        else:  # an asynchronous producer draws ahead: what it has handed over so far
            draws = self.source.checkpoint_state()
            self.async_next_batch = draws.pop("next_batch")
        return {**draws, "evals": self.evals, "policy_version": self.policy_updates,
                "async_next_batch": self.async_next_batch,
                "world_size": self.dist.world}  # fmt: skip

    def close(self) -> None:
        if self.ray_pool is not None:
            self.ray_pool.close()
        if self.source is not None:
            self.source.close()
        for pool in (self.env_pool, self.grader_pool):
            if pool is not None:
                pool.close()
        if self.ledger is not None:
            self.ledger.close()
        if (close_policy := getattr(self.policy, "close", None)) is not None:
            close_policy()  # vLLM: its weights snapshot
        close = getattr(self.grader, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                self._loop.run_until_complete(result)
        self._loop.close()
