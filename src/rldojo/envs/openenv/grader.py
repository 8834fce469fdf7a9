"""The grader of `openenv-v1`: the OpenEnv server's own rewards are the score.

The environment records every step's reward in the rollout's info
(``openenv/rewards``, None where the server gave none); the score is their sum (the
episode's return, `reward = "sum"`) or the last one given (`reward = "last"`). An
episode in which the server gave no reward at all is `invalid` (no value, kept out of
the gradient), never 0; a server grader's failure (``openenv/status`` = ``grade_<s>``,
from `rldojo env serve`) is `error`. When the server sent rldojo's score summary
(``openenv/score``), its components are kept, prefixed ``server/``.
"""

from __future__ import annotations

from typing import Literal

from rldojo.types import Rollout, Score, Task

__all__ = ["OpenEnvRewardGrader"]


class OpenEnvRewardGrader:
    """Scores an `openenv-v1` rollout by the rewards its server gave (module docstring)."""

    name = "openenv_reward"
    version = "1"

    def __init__(self, mode: Literal["sum", "last"], base_url: str = "") -> None:
        """`mode`: openenv-v1's `reward` kwarg; `base_url`: the server, for provenance."""
        self.mode, self.base_url = mode, base_url

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        info = rollout.info
        provenance = {
            "grader": self.name,
            "version": self.version,
            "mode": self.mode,
            "base_url": self.base_url,
        }
        status = str(info.get("openenv/status") or "ok")
        if status.startswith("grade_"):
            why = info.get("openenv/error") or "no reason given"
            return Score.failed(
                "error", f"the server's grader failed ({status}): {why}", provenance=provenance
            )
        rewards = [float(r) for r in info.get("openenv/rewards") or () if r is not None]
        if not rewards:
            return Score.failed(
                "invalid",
                "the OpenEnv server gave no reward in this episode",
                provenance=provenance,
            )
        components = {
            "reward_sum": sum(rewards),
            "reward_last": rewards[-1],
            "rewarded_steps": float(len(rewards)),
        }
        server_score = info.get("openenv/score")
        if isinstance(server_score, dict):
            for key, value in (server_score.get("components") or {}).items():
                if isinstance(value, int | float):
                    components[f"server/{key}"] = float(value)
        value = sum(rewards) if self.mode == "sum" else rewards[-1]
        return Score(
            value=value,
            components=components,
            provenance=provenance,
            explanation=f"{self.mode} of {len(rewards)} server reward(s)",
        )
