"""`coin-v1`, a test environment that gives a random model reward signal: a sample's
reward is the parity of its token ids' sum, so groups of a few samples almost always
mix 0s and 1s (an arithmetic env gives `tiny-random` only flat groups of -0.5)."""

from __future__ import annotations

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import register
from rldojo.types import Score, Task


class CoinEnv(SingleTurnEnv):
    env_id = "coin-v1"

    def tasks(self, split="train", *, seed=0, n=None):
        return [
            Task(id=f"c/{split}/{i}", prompt=f"flip {i}", env="coin-v1") for i in range(n or 40)
        ]

    def default_grader(self):
        return CoinGrader()


class CoinGrader:
    name = "coin"

    async def grade(self, rollout, task):
        return Score(value=float(sum(rollout.completion_ids) % 2))


register("coin-v1", CoinEnv, overwrite=True)
