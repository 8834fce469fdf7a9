"""The dry run's time estimate, calibrated on this machine with the run's own model.

`calibrate` times, in a few seconds, the two things a step does, with the pieces the run
itself uses:

- episodes: a multi-turn environment's episode may end after any turn, so
  `PLAYED_EPISODES` episodes of the run's first environment are played with the run's
  sampler and `[sampling]` through the rollout engine, as a step plays them (all but the
  last turn: an episode still going then takes every turn); a step is priced at the mean
  of their turn counts (`played_turns`).
- generation: the run's sampler (`make_policy`: the native sampler in the run's
  generation dtype, its bf16 copy cast per call as in a synchronous run) on real prompts
  of the run's first environment, repeated as a step repeats them, `min(samples,
  max_batch)` rows at once. One call samples `1 + DECODE_PROBE_TOKENS` tokens: the time
  to its first token prices the prefill (and its sampling), the time from there to the
  last the decode steps. Stop tokens are switched off, so every row decodes every token.
- training: one `PolicyUpdate.optimize` (forward, loss, backward, clip, AdamW) of one
  micro-batch of the step's shape, cut to `TRAIN_PROBE_ROWS` rows: the real prompts and
  `max_new_tokens` completion tokens, grouped as the step groups them, a `loss.rho` share
  of tokens selected; a step's rows are priced at its price per row. The optimizer's
  learning rate is 0, so no weight moves. A one-row update first allocates the
  optimizer's state and warms the kernels.
- load: the 1-minute load average when the calibration ends (its own threads included),
  beside the usable cores. What was timed shared the machine with that load; a run under
  a different load takes longer or less.

`StepCost` prices a step from these: `ceil(samples / batch)` waves, each a turn prefilling
its conversation and sampling `max_new_tokens` (the first with the prefill), then every
micro-batch at the calibrated price, scaled by its tokens. Every sample is assumed to use
all of `max_new_tokens` (an upper bound on generation and training). A multi-turn
episode re-encodes its conversation (prompt and two turns' tokens a finished turn) before
each turn and trains on every turn's tokens. A mean turn count between two whole ones is
priced between their prices (`at_turns`).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rldojo.config import TrainConfig
from rldojo.hardware.threads import usable_cores
from rldojo.types import Rollout, SamplingParams

if TYPE_CHECKING:  # imported where used: `rldojo estimate` starts without them
    from rldojo.policy.base import Policy
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.rollout.mixture import EnvMixture

__all__ = ["Calibration", "StepCost", "at_turns", "calibrate", "turn_limit"]

PLAYED_EPISODES = 4
"""Episodes of a multi-turn environment played at calibration, whose mean turn count
prices a step. They play together, one batched call a turn: on a CPU a decode step of 4
rows costs little more than one of 2, so more episodes make a steadier mean almost for
free. What they cost is their turns: up to `(limit - 1) x max_new_tokens` decode steps,
most of a multi-turn environment's calibration."""

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
    played_turns: tuple[int, ...] = ()  # model turns of each episode played; (): one turn
    load: float = 0.0  # the 1-minute load average when the calibration ended
    cores: int = 1  # the cores this process may use

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


def turn_limit(env: Any, max_turns: int) -> int:
    """The most model turns an episode of `env` may take: `rollout.max_turns` capped by
    its episode `limits`; 1 for an environment without them (it answers once)."""
    limits = getattr(env, "limits", None)
    return 1 if limits is None else min(max_turns, limits.max_turns)


def _model_turns(rollout: Rollout) -> int:
    """Turns the policy took: the runs of policy-written tokens in the completion."""
    mask = rollout.policy_mask
    return sum(1 for i, mine in enumerate(mask) if mine and (i == 0 or not mask[i - 1]))


def _played_turns(config: TrainConfig, mixture: EnvMixture, policy: Policy) -> tuple[int, ...]:
    """Model turns of `PLAYED_EPISODES` episodes of the first environment's first tasks,
    played by `policy` with the run's sampling and episode limits; () where an episode
    takes one turn, or none ended `ok` or `truncated` (an environment failure).

    The last turn is not played: an episode still going after `limit - 1` turns takes
    exactly `limit` (the engine or the environment ends it then), so the engine stops it
    one turn early and it is counted at `limit`."""
    from rldojo.rollout.episodes import collect_rollouts

    ro, s = config.rollout, config.sampling
    tasks = next(slot for slot in mixture.slots.values() if slot.train_tasks).train_tasks
    limit = turn_limit(mixture.make_env_for(tasks[0]), ro.max_turns)
    if limit < 2:
        return ()
    seed = config.run.seed
    requests = [(tasks[i % len(tasks)], 0, seed + i) for i in range(PLAYED_EPISODES)]
    sampling = SamplingParams(s.max_new_tokens, s.temperature, s.top_p, tuple(s.stop), seed)
    rollouts = asyncio.run(
        collect_rollouts(
            mixture.make_env_for,
            policy,
            requests,
            sampling,
            env_timeout_s=ro.env_timeout_s,
            max_turns=limit - 1,
            max_episode_tokens=ro.max_episode_tokens,
        )
    )
    return tuple(
        limit if r.info.get("episode/cut") == "turns" else _model_turns(r)
        for r in rollouts
        if r.status in ("ok", "truncated")
    )


def _time_generation(policy: TransformersPolicy, prompts: list[list[int]]) -> tuple[float, float]:
    """(seconds to prefill and sample one token, seconds of each further token) of
    `prompts` decoded together, from one call's decode steps."""
    policy.eos_ids = set()  # every row decodes every token: what is timed is fixed
    params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=0)
    policy.generate(prompts[:1], params)  # warm-up: kernels, the copy's first cast
    steps: list[float] = []  # when each token was sampled
    t0 = time.perf_counter()
    policy.generate(
        prompts,
        SamplingParams(max_new_tokens=1 + DECODE_PROBE_TOKENS, temperature=1.0, seed=0),
        on_step=lambda _: steps.append(time.perf_counter()),
    )
    return steps[0] - t0, (steps[-1] - steps[0]) / DECODE_PROBE_TOKENS


def _micro_batch(prompts: list[list[int]], rows: int, new: int, group: int, pad: int) -> Any:
    """A token batch of `rows` rows: real prompts, `new` random completion tokens each."""
    from rldojo.training.batch import build_token_batch

    gen = torch.Generator().manual_seed(0)

    def row(i: int) -> Rollout:
        ids = torch.randint(0, 1000, (new,), generator=gen).tolist()  # [new]
        return Rollout(
            str(i),
            "calibration",
            [],
            "",
            prompt_ids=tuple(prompts[i % len(prompts)]),
            completion_ids=tuple(ids),
            policy_mask=(True,) * new,
            logprobs=(-1.0,) * new,
            entropies=(1.0,) * new,
        )

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
    sync = config.model_copy(
        update={"rollout": config.rollout.model_copy(update={"max_policy_lag": 0})}
    )
    policy = make_policy(sync, model, tokenizer, generation_dtype)
    prompts = _prompts(config, mixture, policy)
    played = _played_turns(config, mixture, policy)  # before stop tokens are switched off
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
        played_turns=played,
        load=os.getloadavg()[0],
        cores=usable_cores(),
    )


def at_turns(price: Callable[[int], float], turns: float) -> float:
    """`price(turns)` at a mean turn count: between the prices of the whole counts on
    either side, by how far it lies between them."""
    low = max(math.floor(turns), 1)
    share = turns - low
    return price(low) if share <= 0 else (1 - share) * price(low) + share * price(low + 1)


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
