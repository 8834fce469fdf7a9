"""The dry run's time estimate, calibrated on this machine with the run's own model.

`calibrate` times, in a few seconds, the two things a step does, with the pieces the run
itself uses:

- generation: the run's sampler (`make_policy`: the native sampler in the run's
  generation dtype, its bf16 copy cast per call as in a synchronous run) on real prompts
  of the run's first environment, repeated as a step repeats them, `min(samples,
  max_batch)` rows at once. One call samples 1 token (the prefill and its sampling), one
  samples `1 + DECODE_PROBE_TOKENS`; their difference prices the decode steps. Stop
  tokens are switched off, so every row decodes every token.
- training: one `PolicyUpdate.optimize` (forward, loss, backward, clip, AdamW) of one
  micro-batch of the step's shape, cut to `TRAIN_PROBE_ROWS` rows: the real prompts and
  `max_new_tokens` completion tokens, grouped as the step groups them, a `loss.rho` share
  of tokens selected; a step's rows are priced at its price per row. The optimizer's
  learning rate is 0, so no weight moves. A one-row update first allocates the
  optimizer's state and warms the kernels.

`StepCost` prices a step from these: `ceil(samples / batch)` waves, each a turn prefilling
its conversation and sampling `max_new_tokens` (the first with the prefill), then every
micro-batch at the calibrated price, scaled by its tokens. Every sample is assumed to use
all of `max_new_tokens` (an upper bound on generation and training). A multi-turn
episode re-encodes its conversation (prompt and two turns' tokens a finished turn) before
each turn and trains on every turn's tokens.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rldojo.config import TrainConfig
from rldojo.types import Rollout, SamplingParams

if TYPE_CHECKING:  # imported where used: `rldojo estimate` starts without them
    from rldojo.policy.base import Policy
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.rollout.mixture import EnvMixture

__all__ = ["Calibration", "StepCost", "calibrate"]

DECODE_PROBE_TOKENS = 8
"""Decode steps timed beyond the prefill call (their difference prices one step)."""
TRAIN_PROBE_ROWS = 16
"""Most rows of the timed micro-batch (the default `optim.micro_batch_size`, so the
quickstart is timed at its own shape). Fewer rows would be quicker to time, but a narrow
micro-batch costs more per row, and the estimate would price every row at that cost."""
FORWARD_SHARE = 1 / 3
"""A forward without gradient, as a share of forward + backward (backward ~2 forwards):
the price of `pi_old`, trainer-side entropy and KL-reference passes."""


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` measured (seconds)."""

    batch: int  # rows decoded at once
    prompt_tokens: int  # the longest calibration prompt
    prefill_s: float  # prefill `batch` prompts, sample a token (and cast a bf16 copy)
    decode_token_s: float  # one more token for `batch` rows: a decode step and sampling
    micro_rows: int  # rows of the timed micro-batch
    micro_new: int  # completion tokens of each of its rows
    micro_batch_s: float  # one micro-batch update: forward, backward, optimizer step
    took_s: float  # the calibration itself

    def describe(self) -> str:
        return (
            f"calibrated here in {self.took_s:.0f} s: prefill {self.prefill_s:.1f} s and "
            f"{self.decode_token_s * 1000:.0f} ms a token at batch {self.batch}, "
            f"{self.micro_batch_s:.1f} s a micro-batch of {self.micro_rows}"
        )


def _prompts(config: TrainConfig, mixture: EnvMixture, policy: Policy) -> list[list[int]]:
    """Prompt ids of the first environment's first tasks, each repeated `group_size` times."""
    ro = config.rollout
    slot = next(s for s in mixture.slots.values() if s.train_tasks)
    out: list[list[int]] = []
    for task in slot.train_tasks[: ro.prompts_per_step]:
        env = mixture.make_env_for(task)
        observation = asyncio.run(env.reset(task, seed=0))
        ids = policy.encode_chat(observation.messages, observation.info.get("tools") or None)
        out += [list(ids)] * ro.group_size
    return out


def _time_generation(policy: TransformersPolicy, prompts: list[list[int]]) -> tuple[float, float]:
    """(seconds to prefill and sample one token, seconds of each further token) of
    `prompts` decoded together."""
    policy.eos_ids = set()  # every row decodes every token: what is timed is fixed
    params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=0)
    policy.generate(prompts[:1], params)  # warm-up: kernels, the copy's first cast
    timed = []
    for new in (1, 1 + DECODE_PROBE_TOKENS):
        t0 = time.perf_counter()
        policy.generate(prompts, SamplingParams(max_new_tokens=new, temperature=1.0, seed=0))
        timed.append(time.perf_counter() - t0)
    decode = max(timed[1] - timed[0], 0.0) / DECODE_PROBE_TOKENS
    return timed[0], decode


def _micro_batch(prompts: list[list[int]], rows: int, new: int, group: int, pad: int) -> Any:
    """A token batch of `rows` rows: real prompts, `new` random completion tokens each."""
    from rldojo.training.batch import build_token_batch

    gen = torch.Generator().manual_seed(0)

    def row(i: int) -> Rollout:
        ids = torch.randint(0, 1000, (new,), generator=gen).tolist()  # [new]
        return Rollout(str(i), "calibration", [], "", prompt_ids=tuple(prompts[i % len(prompts)]),
                       completion_ids=tuple(ids), policy_mask=(True,) * new,
                       logprobs=(-1.0,) * new, entropies=(1.0,) * new)  # fmt: skip

    return build_token_batch([row(i) for i in range(rows)], pad, [i // group for i in range(rows)])


def _time_update(
    config: TrainConfig, model: Any, pad: int, prompts: list[list[int]]
) -> tuple[int, float]:
    """(rows, seconds) of one micro-batch update of the step's shape (module docstring)."""
    from rldojo.policy.lora import trainable_parameters
    from rldojo.training.update import PolicyUpdate

    optim = config.optim.model_copy(update={"mini_batches": 1, "epochs": 1})
    one = config.model_copy(update={"optim": optim})
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=0.0, fused=True)
    update = PolicyUpdate(model, None, optimizer, one)
    rows = min(optim.micro_batch_size, len(prompts), TRAIN_PROBE_ROWS)
    gen = torch.Generator().manual_seed(0)
    times = []
    # the one-row warm-up allocates AdamW's state and warms the kernels; the second is timed
    for n, new in ((1, 4), (rows, config.sampling.max_new_tokens)):
        batch = _micro_batch(prompts, n, new, config.rollout.group_size, pad)
        shape = batch.completion_ids.shape  # [M, T]
        advantages = torch.randn(shape, generator=gen)  # [M, T]
        selected = torch.rand(shape, generator=gen) < max(config.loss.rho, 1e-3)  # [M, T]
        t0 = time.perf_counter()
        update.optimize(batch, advantages, selected, version=0)
        times.append(time.perf_counter() - t0)
    optimizer.zero_grad(set_to_none=True)
    return rows, times[-1]


def calibrate(
    config: TrainConfig, mixture: EnvMixture, model: Any, tokenizer: Any, generation_dtype: Any
) -> Calibration | None:
    """Time generation and one training micro-batch of this run here (module docstring);
    None where the native sampler is not the run's (vLLM), so the probe estimate stays."""
    if config.generation.backend != "native":
        return None
    from rldojo.policy.training_model import make_policy

    started = time.perf_counter()
    sync = config.model_copy(update={"rollout": config.rollout.model_copy(
        update={"max_policy_lag": 0})})  # fmt: skip
    policy = make_policy(sync, model, tokenizer, generation_dtype)
    prompts = _prompts(config, mixture, policy)
    batch = min(len(prompts), policy.max_batch)
    prefill, decode = _time_generation(policy, prompts[:batch])
    rows, micro = _time_update(config, model, tokenizer.pad_token_id, prompts)
    return Calibration(
        batch=batch,
        prompt_tokens=max(len(p) for p in prompts),
        prefill_s=prefill,
        decode_token_s=decode,
        micro_rows=rows,
        micro_new=config.sampling.max_new_tokens,
        micro_batch_s=micro,
        took_s=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class StepCost:
    """Prices a run's steps and evaluations from a `Calibration` (module docstring)."""

    cal: Calibration
    config: TrainConfig
    prompt: int  # prompt tokens of the run's first environment

    def generate_s(self, episodes: int, new: int, turns: int) -> float:
        """Seconds to generate `episodes` episodes of `turns` turns, `new` tokens a turn."""
        waves = math.ceil(episodes / self.cal.batch) if episodes else 0
        per_token = self.cal.prefill_s / max(self.cal.prompt_tokens, 1)  # a batch's token
        turn_s = sum(
            per_token * (self.prompt + 2 * t * new) + (new - 1) * self.cal.decode_token_s
            for t in range(turns)
        )
        return waves * turn_s

    def train_s(self, turns: int) -> float:
        """Seconds of one step's update: every row of every epoch at the calibrated
        micro-batch's price per row, scaled by its tokens, plus the passes without
        gradient the config asks for (each `FORWARD_SHARE` of a pass with one)."""
        ro, oc, lc = self.config.rollout, self.config.optim, self.config.loss
        samples, new = ro.prompts_per_step * ro.group_size, self.config.sampling.max_new_tokens
        shared = self.prompt / ro.group_size  # a group's prompt runs once
        scale = ((2 * turns - 1) * new + shared) / (self.cal.micro_new + shared)
        forwards = (oc.mini_batches > 1 or oc.epochs > 1) + (lc.entropy_source != "sampler")
        forwards += oc.epochs if lc.kl_coef > 0 else 0
        passes = oc.epochs + forwards * FORWARD_SHARE
        per_row = self.cal.micro_batch_s / max(self.cal.micro_rows, 1)
        return passes * samples * per_row * scale

    def step_s(self, turns: int) -> float:
        """A step whose episodes take `turns` turns: generation, then the update."""
        ro, new = self.config.rollout, self.config.sampling.max_new_tokens
        samples = ro.prompts_per_step * ro.group_size
        return self.generate_s(samples, new, turns) + self.train_s(turns)
