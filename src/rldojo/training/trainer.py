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
import random
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

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
    vllm_memory_share,
)
from rldojo.policy.vllm_backend import check_vllm
from rldojo.report.trackers import check_report_to
from rldojo.rollout.env_pool import EnvWorkerPool
from rldojo.rollout.generation import Generation, LocalGeneration, RayGeneration, Rounds
from rldojo.rollout.groups import Group
from rldojo.rollout.mixture import MixtureGrader
from rldojo.rollout.sources import RolloutSource, make_source
from rldojo.rollout.tasks import TaskSampler
from rldojo.store.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from rldojo.store.files import write_atomically
from rldojo.store.ledger import Ledger
from rldojo.training import losses
from rldojo.training.batch import build_token_batch
from rldojo.training.failures import FailureBudget, reference_preflight
from rldojo.training.heldout import eval_record, heldout_eval, heldout_tasks
from rldojo.training.preflight import build_mixture, env_entries, pass_threshold
from rldojo.training.resources import resolve_resources
from rldojo.training.step_metrics import (
    entropy_stats,
    forking_tokens,
    mask_threshold,
    rollout_metrics,
)
from rldojo.training.stops import FailureBudgetExceeded
from rldojo.training.update import (
    PolicyUpdate,
    adamw_with_schedule,
    release_freed_memory,
    token_advantages,
)
from rldojo.types import SamplingParams, Task


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


class Trainer:
    """Owns the model, optimizer, policy, environment, grader, ledger and run directory."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, resume: bool = False) -> None:
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
        self.curriculum = self._curriculum() if cfg.curriculum.enabled else None
        self.tasks = TaskSampler(self.envs, self.curriculum, seed=cfg.run.seed)
        checkpoint = latest_checkpoint(run_dir / "checkpoints") if resume else None
        if checkpoint is None or cfg.loss.kl_coef > 0:  # the KL reference loads the base
            check_model(cfg.model.name)
        check_training_model(cfg.model, checkpoint, cfg.run.cluster)  # LoRA's needs
        check_vllm(cfg)  # generation.backend = "vllm": its package and settings
        self.device = torch.device(self.precision.device)  # run.device, resolved
        run_dir.mkdir(parents=True, exist_ok=True)
        # First, and atomically: a run killed at any later point can be resumed from it.
        write_atomically(run_dir / "config.toml", dump_config(cfg))
        self.model, self.tokenizer = load_training_model(
            cfg.model, checkpoint, self.device, lambda name: load_model(name)
        )  # late-bound: tests replace `load_model` here
        gen_dtype = self.precision.torch_generation_dtype()
        self.policy = make_policy(cfg, self.model, self.tokenizer, gen_dtype)
        self.source: RolloutSource | None = None  # started by the first step
        self.grader_pool: EnvWorkerPool | None = None  # graders in workers (own timeout)
        self.env_pool: EnvWorkerPool | None = None
        if cfg.rollout.env_workers > 0:  # environments in worker processes
            self.env_pool = EnvWorkerPool(
                cfg.rollout.env_workers,
                timeout_s=cfg.rollout.env_timeout_s,
                retries=cfg.rollout.env_retries,
            )
        if cfg.rollout.grade_in_workers:
            self.grader = self._remote_graders()
        self.ray_pool = self._ray_pool(entries) if cfg.run.cluster == "ray" else None
        generation: Generation = (
            LocalGeneration(self.make_env, self.policy, self.grader, cfg.rollout)
            if self.ray_pool is None  # else generation, envs and grading on Ray actors
            else RayGeneration(self.ray_pool, cfg.rollout.group_size, lambda: self.policy_updates)
        )
        self.rounds = Rounds(self.tasks, generation, cfg.rollout, self.sampling)
        # The KL reference is the initial model, also after a resume from a checkpoint.
        self.ref_model = None
        if cfg.loss.kl_coef > 0:
            self.ref_model = load_reference(
                cfg.model, self.model, checkpoint, self.device, lambda name: load_model(name)
            )
        self.optimizer, self.scheduler = adamw_with_schedule(
            trainable_parameters(self.model),  # the adapters alone under LoRA
            cfg.optim, lr=cfg.optim.lr, warmup=cfg.optim.warmup_steps, total=cfg.run.steps,
        )  # fmt: skip
        self.update = PolicyUpdate(self.model, self.ref_model, self.optimizer, cfg)
        self.step_num = 0
        self.policy_updates = 0  # weight updates so far (the trainer's policy version)
        self.async_next_batch = 0  # the async producer's next batch (continues on resume)
        self.evals: dict[str, dict[str, Any]] = {}
        if checkpoint is not None:
            state = load_trainer_state(checkpoint, self.optimizer, self.scheduler)
            self.step_num, self.evals = state["step"], state.get("evals", {})
            self.tasks.load_state_dict(state)
            self.async_next_batch = int(state.get("async_next_batch", 0))
            self.policy_updates = state.get("policy_version", self.step_num)
            self.policy.version = self.policy_updates
        self.ledger = Ledger(run_dir / "ledger.sqlite")
        self._selection: dict[int, tuple[float, list[int]]] = {}  # of the last train_on
        self.failures = FailureBudget(cfg.run.max_failure_rate, cfg.run.failure_window)
        self.over_budget: FailureBudgetExceeded | None = None  # the loop raises it
        if resume:
            self.ledger.rollback(self.step_num)  # training after the checkpoint was lost
        if self.ray_pool is not None:
            self.ray_pool.publish(self.model, self.policy_updates)
        # One event loop for the trainer's life: grader worker pools bind to it.
        self._loop = asyncio.new_event_loop()

    # ------------------------------------------------------------------ the flow

    def step(self) -> dict[str, Any]:
        """One optimizer step: collect informative groups, then train on them."""
        started = time.perf_counter()
        collected = self.rollout_source().collect(self.step_num, self.policy_updates)
        groups, timing, rounds = collected.groups, collected.timing, collected.rounds
        all_rollouts, all_scores = collected.rollouts, collected.scores
        metrics = rollout_metrics(
            all_rollouts, all_scores, groups, self.config.rollout, self.pass_threshold
        )
        metrics["rollout/extra_rounds"] = rounds
        informative = [g for g in groups if g.informative]
        trained = informative[: self.config.rollout.prompts_per_step]  # the rest: untrained
        metrics["rollout/groups_surplus"] = len(informative) - len(trained)
        if trained:
            t0 = time.perf_counter()
            release_freed_memory()  # what generation freed, before the gradients are made
            metrics |= self.train_on(trained)
            timing["time/train"] = time.perf_counter() - t0
            self.ledger.mark_trained(
                [i for g in trained for i in g.ledger_ids], self.step_num + 1, self._selection
            )
        else:
            metrics["train/skipped"] = 1  # no signal in any group: no update this step
        self.step_num += 1
        self.over_budget = self.failures.observe(self.step_num, all_rollouts, all_scores)
        with warnings.catch_warnings():  # a skipped update still advances the LR schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        timing["time/step"] = time.perf_counter() - started
        n_tokens = sum(len(r.completion_ids) for r in all_rollouts)
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
        self.ledger.add_step(self.step_num, metrics)
        return metrics

    def rollout_source(self) -> RolloutSource:
        """The source of graded groups (`rldojo.rollout.sources`), started on first use:
        after a resume has restored the draw position, and after the "before" evaluation
        (an asynchronous producer would otherwise generate alongside it)."""
        if self.source is None:
            self.source = make_source(
                self.rounds, self.config.rollout, self.ledger, self._loop,
                seed=self.config.run.seed, next_batch=self.async_next_batch,
                step=lambda: self.step_num,
            )  # fmt: skip
        return self.source

    def train_on(self, groups: Sequence[Group]) -> dict[str, Any]:
        """Advantages -> entropy -> forking-token mask -> accumulated loss -> optimizer step."""
        cfg, lc = self.config, self.config.loss
        rollouts = [r for g in groups for r, ok in zip(g.rollouts, g.valid, strict=True) if ok]
        scores = [s for g in groups for s, ok in zip(g.scores, g.valid, strict=True) if ok]
        rewards = torch.tensor([s.value for s in scores])  # [B]
        group_ids = torch.tensor([i for i, g in enumerate(groups) for ok in g.valid if ok])  # [B]
        advantages = losses.group_advantages(
            rewards, group_ids, scale_by_std=lc.scale_adv_by_std
        )  # [B]
        batch = build_token_batch(rollouts, self.tokenizer.pad_token_id, group_ids.tolist())
        entropy = (
            batch.sampler_entropy if lc.entropy_source == "sampler" else self.update.entropy(batch)
        )  # [B, T]
        rng = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + self.step_num)
        selected = losses.high_entropy_mask(
            losses.selection_key(entropy, lc.select, rng),
            batch.policy_mask,
            lc.rho,
            lc.scope,
            cfg.optim.micro_batch_size,
        )  # [B, T] (once per rollout batch, whatever the number of optimizer steps)
        ids = [i for g in groups for i, ok in zip(g.ledger_ids, g.valid, strict=True) if ok]
        adv, sel = advantages.tolist(), selected.cpu()  # one copy, not a sync per row
        self._selection = {  # for the ledger: each row's advantage and selected positions
            i: (adv[b], sel[b, : len(r.completion_ids)].nonzero()[:, 0].tolist())
            for b, (i, r) in enumerate(zip(ids, rollouts, strict=True))
        }
        token_adv = token_advantages(advantages, scores, batch.policy_mask.shape[1])  # [B, T]
        metrics = self.update.optimize(batch, token_adv, selected, self.policy_updates)
        published = time.perf_counter()
        self.policy.update_weights()
        metrics["time/update_weights"] = time.perf_counter() - published  # to the sampler
        self.policy_updates += 1
        if self.ray_pool is not None:  # here, not in a rollout thread: the optimizer is idle
            self.ray_pool.publish(self.model, self.policy_updates)
        metrics |= {f"entropy/{k}": v for k, v in entropy_stats(entropy, batch.policy_mask).items()}
        metrics["entropy/threshold"] = mask_threshold(
            entropy, selected, lc.scope, cfg.optim.micro_batch_size
        )
        metrics["entropy/tokens_selected"] = int(selected.sum())
        metrics["entropy/tokens_policy"] = int(batch.policy_mask.sum())
        metrics["entropy/source"] = lc.entropy_source  # whose entropies chose the mask
        metrics["entropy/forking_tokens"] = forking_tokens(
            self.tokenizer, batch.completion_ids, selected
        )
        metrics["train/sequences"] = batch.size
        return metrics

    # ------------------------------------------------------------------ helpers

    def make_env(self, task: Task) -> Env:
        if self.env_pool is not None:
            slot = self.envs.slot_for(task)
            return self.env_pool.make_env(slot.env_id, slot.kwargs)
        return self.envs.make_env_for(task)

    def sampling(self, seed: int | None = None) -> SamplingParams:
        s = self.config.sampling
        return SamplingParams(s.max_new_tokens, s.temperature, s.top_p, tuple(s.stop), seed)

    def _curriculum(self) -> Any:
        from rldojo.data.curriculum import Curriculum, CurriculumConfig

        c = self.config.curriculum
        tasks = [t for slot in self.envs.slots.values() for t in slot.train_tasks]
        knobs = CurriculumConfig(
            window=c.window, mode=c.mode, saturated_weight=c.saturated_weight,
            pass_threshold=self.pass_threshold if c.pass_threshold is None else c.pass_threshold,
        )  # fmt: skip
        return Curriculum(tasks, knobs)

    def grader_preflight(self) -> FailureBudgetExceeded | None:
        """The stop when the grader fails on every reference answer (`train.failures`)."""
        return reference_preflight(self.envs, self.grader, self._loop,
                                   timeout_s=self.config.rollout.grade_timeout_s)  # fmt: skip

    def evaluate(self, label: str) -> EvalResult:
        """Greedy accuracy on the held-out tasks; stored under `label` in the run state."""
        tasks = heldout_tasks(self.config, self.test_tasks, label)
        result = heldout_eval(self.config, self.make_env, self.grader, self.policy,
                              tasks, self.pass_threshold, self._loop)  # fmt: skip
        self.evals[label] = eval_record(result)
        return result

    def save(self) -> Path:
        if self.source is None:
            draws = self.tasks.state_dict()
        else:  # an asynchronous producer draws ahead: what it has handed over so far
            draws = self.source.checkpoint_state()
            self.async_next_batch = draws.pop("next_batch")
        return save_checkpoint(
            self.run_dir / "checkpoints",
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            step=self.step_num,
            state={
                **draws,
                "evals": self.evals,
                "policy_version": self.policy_updates,
                "async_next_batch": self.async_next_batch,
            },
        )

    def _remote_graders(self) -> MixtureGrader:
        """Each environment's grader (or the spec's), built and run in worker processes."""
        ro, spec = self.config.rollout, self.config.grader.spec
        pool = EnvWorkerPool(max(1, ro.env_workers), timeout_s=ro.grade_timeout_s,
                             retries=ro.env_retries)  # fmt: skip
        self.grader_pool = pool
        return MixtureGrader({
            env_id: pool.spec_grader(spec, slot.grader.name) if spec is not None
            else pool.env_grader(env_id, slot.kwargs, slot.grader.name)
            for env_id, slot in self.envs.slots.items()
        })  # fmt: skip

    def _ray_pool(self, entries: list) -> Any:
        from rldojo.cluster.ray_pool import RayRolloutPool, WorkerSampler

        cfg = self.config
        ro = cfg.rollout
        sampler = WorkerSampler(cfg.generation.backend, cfg.model.generation_dtype, cfg.run.seed,
                                vllm_memory_share(cfg), cfg.generation.prefix_cache_mb)  # fmt: skip
        args = (
            cfg.model.name, entries, cfg.grader.spec, sampler,
            ro.env_timeout_s, ro.grade_timeout_s, ro.max_turns, ro.worker_threads,
        )  # fmt: skip
        return RayRolloutPool(
            workers=ro.workers, actor_args=args, address=cfg.run.ray_address,
            timeout_s=ro.worker_timeout_s, num_gpus=ro.worker_gpus,
        )  # fmt: skip

    def close(self) -> None:
        if self.ray_pool is not None:
            self.ray_pool.close()
        if self.source is not None:
            self.source.close()
        for pool in (self.env_pool, self.grader_pool):
            if pool is not None:
                pool.close()
        self.ledger.close()
        if (close_policy := getattr(self.policy, "close", None)) is not None:
            close_policy()  # vLLM: its weights snapshot
        close = getattr(self.grader, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                self._loop.run_until_complete(result)
        self._loop.close()
