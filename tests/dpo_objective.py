"""A fourth objective in one file: DPO on preference pairs (test-only).

Direct Preference Optimization (Rafailov et al. 2023): for a prompt with a chosen and a
rejected reply, the loss is

    -log σ(β [(log π(chosen) - log π_ref(chosen)) - (log π(rejected) - log π_ref(rejected))])

with π_ref the initial model, frozen. Everything else a run needs (the model and its
LoRA, the optimizer and schedule, sharding, the held-out evaluation, checkpoints and
resume, callbacks) is the run's (`rldojo.training.run.Run`) and the loop's; this file is
only what differs: its data, its batch and loss, its state. `tests/training/test_dpo.py`
runs it through `run_loop`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from rldojo.rollout.replay import conversation_rollout
from rldojo.training.batch import build_token_batch, completion_logits
from rldojo.training.run import Run
from rldojo.training.stops import RunStopped
from rldojo.training.update import forward_context
from rldojo.types import Rollout

Pair = tuple[str, str, str]
"""(prompt, chosen reply, rejected reply)."""


class DpoObjective:
    """DPO on `pairs`, `batch_size` pairs a step, `epochs` passes, `beta` β."""

    command = "dpo"
    kind = "dpo"
    summary_keys = ("model", "pairs", "steps", "loss_first", "loss_last", "accuracy_before",
                    "accuracy_after", "checkpoint", "wall_s")  # fmt: skip

    def __init__(self, run: Run, pairs: Sequence[Pair], *, beta: float = 0.1,
                 batch_size: int = 2, epochs: int = 2) -> None:  # fmt: skip
        if not pairs:
            raise ValueError("dpo: no preference pairs")
        self.run, self.beta, self.pairs = run, beta, list(pairs)
        run.load(sampler=False)
        self.reference = run.reference()
        order = []
        rng = random.Random(run.config.run.seed)
        for _ in range(epochs):
            shuffled = list(range(len(self.pairs)))
            rng.shuffle(shuffled)
            order += [shuffled[i : i + batch_size] for i in range(0, len(shuffled), batch_size)]
        self.schedule = order
        self.total_steps = len(order)
        self.loss_first: float | None = None
        self.loss_last: float | None = None
        self.over_budget: RunStopped | None = None
        run.start(self)

    def _rollouts(self, rows: Sequence[int]) -> list[Rollout]:
        """Chosen then rejected replies of `rows`, as the engine tokenizes a conversation."""
        out = []
        for reply in (1, 2):
            for i in rows:
                pair = self.pairs[i]
                messages = [{"role": "user", "content": pair[0]},
                            {"role": "assistant", "content": pair[reply]}]  # fmt: skip
                out.append(conversation_rollout(self.run.tokenizer, messages, None,
                                                task_id=f"pair-{i}", env="dpo"))  # fmt: skip
        return out

    def _logprobs(self, model: Any, batch: Any) -> torch.Tensor:
        """Summed log-probability of each row's reply tokens: [2N]."""
        logits = completion_logits(model, batch, share_prefix=False).float()  # [2N, T, V]
        token = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])
        return (token[..., 0] * batch.policy_mask).sum(-1)  # [2N]

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        run = self.run
        rows = self.schedule[run.step_num]
        batch = build_token_batch(self._rollouts(rows), run.pad_id)
        batch = batch.to(run.device)
        with torch.no_grad():
            ref = self._logprobs(self.reference, batch)  # [2N]
        with forward_context(run.config, run.model, run.device):
            policy = self._logprobs(run.model, batch)  # [2N]
        n = len(rows)
        ratio = (policy - ref)[:n] - (policy - ref)[n:]  # [N]: chosen - rejected
        loss = -torch.nn.functional.logsigmoid(self.beta * ratio).mean()
        loss.backward()
        lr = run.lr()
        norm, stepped = run.optimizer_step()
        value = float(loss.detach())
        self.loss_first = value if self.loss_first is None else self.loss_first
        self.loss_last = value
        return {"dpo/loss": value, "dpo/margin": float(ratio.mean().detach()),
                "dpo/grad_norm": norm, "optim/lr": lr,
                "optim/nonfinite_skipped": float(not stepped),
                "time/step": time.perf_counter() - t0}  # fmt: skip

    def header(self) -> list[str]:
        return [f"dpo {self.run.config.model.name} on {len(self.pairs)} pairs"]

    def preflight(self) -> RunStopped | None:
        return None

    def after_step(self, metrics: dict[str, Any]) -> list[str]:
        return []

    def step_line(self, step: int, m: dict[str, Any]) -> str:
        return f"dpo step {step}/{self.total_steps} loss {m['dpo/loss']:.4f}"

    def state_dict(self) -> dict[str, Any]:
        return {"loss_first": self.loss_first, "loss_last": self.loss_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_first, self.loss_last = state["loss_first"], state["loss_last"]

    def summary(self) -> dict[str, Any]:
        return {"model": self.run.config.model.name, "pairs": len(self.pairs),
                "loss_first": self.loss_first, "loss_last": self.loss_last}  # fmt: skip

    def close(self) -> None:
        pass
