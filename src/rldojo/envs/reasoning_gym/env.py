"""reasoning-gym-v1: reasoning-gym's procedural datasets as rldojo environments.

    env = make_env("reasoning-gym-v1", dataset="leg_counting", config={"min_animals": 2})

Needs the optional package ``reasoning-gym`` (``pip install reasoning-gym``); without it
`make_env` raises `OptionalDependencyError` saying so. Tasks come from
``reasoning_gym.create_dataset(dataset, seed=..., size=n, **config)``; the train split
uses the seed as given and the test split ``seed + TEST_SEED_OFFSET``, so the two are
different draws (for datasets with a small space of questions they may still overlap).

The policy answers in ``<answer>...</answer>`` (an ``Answer: ...`` line is accepted);
the reward is the dataset's own ``score_answer(answer, entry)`` in [0, 1], minus
`format_penalty` when no answer could be found (flagged `no_answer`). A scorer that
raises is a failed score (``error``), never a 0; one that runs past `timeout_s` is
``timeout``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import importlib
import re
from collections.abc import Iterable
from typing import Any

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.registry import EnvKwargsError, register
from rldojo.graders.rules import NO_ANSWER_FLAG, extract_answer
from rldojo.types import Rollout, Score, Task

__all__ = ["OptionalDependencyError", "ReasoningGymEnv", "ReasoningGymGrader"]

ENV_ID = "reasoning-gym-v1"
TEST_SEED_OFFSET = 1_000_003
DEFAULT_N = {"train": 1000, "test": 200}
INSTRUCTION = "Think it through, then give only the final answer in <answer>...</answer>."
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class OptionalDependencyError(ImportError):
    """An optional extra needed by this environment is not installed."""


def _reasoning_gym() -> Any:
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as exc:
        raise OptionalDependencyError(
            f"{ENV_ID} needs the optional package reasoning-gym: pip install reasoning-gym ({exc})"
        ) from None


def _scorer(source: tuple[Any, ...]) -> Any:
    try:
        return _cached_scorer(*source)
    except TypeError:  # unhashable config values: build it uncached
        return _cached_scorer.__wrapped__(*source)


@functools.lru_cache(maxsize=32)
def _cached_scorer(dataset: str, seed: int, size: int, config: tuple[tuple[str, Any], ...]) -> Any:
    rg = _reasoning_gym()
    if hasattr(rg, "get_score_answer_fn"):
        return rg.get_score_answer_fn(dataset)
    return rg.create_dataset(dataset, seed=seed, size=size, **dict(config)).score_answer


def final_answer(text: str) -> str | None:
    """The last ``<answer>...</answer>``, else an ``Answer:`` line or ``\\boxed{}``."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else extract_answer(text)


class ReasoningGymGrader:
    """``score_answer(answer, entry)`` of the task's dataset (see the module docstring)."""

    name = "reasoning_gym"
    version = "1"

    def __init__(self, *, format_penalty: float = 0.0, timeout_s: float = 10.0) -> None:
        self.format_penalty = format_penalty
        self.timeout_s = timeout_s

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = {"grader": self.name, "version": self.version, "dataset": task.info.get("dataset")}
        source = task.info.get("source")
        entry = task.info.get("entry")
        if not source or entry is None:
            return Score.failed(
                "invalid", f"task {task.id} is not a reasoning-gym task", provenance=prov
            )
        answer = final_answer(rollout.completion)
        if answer is None:
            return Score(
                -self.format_penalty,
                components={"correct": 0.0, "format": 0.0},
                flags=(NO_ANSWER_FLAG,),
                explanation="no answer found",
                provenance=prov,
            )
        try:
            score_fn = _scorer(tuple(source))
            value = await asyncio.wait_for(
                asyncio.to_thread(score_fn, answer=answer, entry=entry), self.timeout_s
            )
        except TimeoutError:
            return Score.failed(
                "timeout", f"score_answer took longer than {self.timeout_s:g}s", provenance=prov
            )
        except Exception as exc:  # the scorer's failure is not the policy's 0
            return Score.failed(
                "error", f"score_answer raised {type(exc).__name__}: {exc}", provenance=prov
            )
        value = float(value or 0.0)
        return Score(
            value,
            components={"correct": 1.0 if value >= 1.0 else 0.0, "format": 1.0, "score": value},
            explanation=f"answer {answer[:80]!r}",
            provenance=prov,
        )


def _check_dataset(rg: Any, dataset: str, config: dict[str, Any]) -> None:
    """An unknown dataset or config key is an `EnvKwargsError` naming the key, with the
    closest name, when the environment is built (reasoning-gym itself says only "Dataset
    'chain_sumx' not registered", when the first tasks are drawn). A reasoning-gym
    without the `factory.DATASETS` registry is not checked: `create_dataset` says."""
    registry = getattr(getattr(rg, "factory", None), "DATASETS", None)
    if not isinstance(registry, dict):
        return
    if dataset not in registry:
        raise EnvKwargsError(f"env.kwargs.dataset: reasoning-gym has no dataset {dataset!r}"
                             f"{_did_you_mean(dataset, registry)}")  # fmt: skip
    config_cls = registry[dataset][1]
    if not dataclasses.is_dataclass(config_cls):
        return
    # seed and size are the environment's to set, per split
    accepted = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    for key in config:
        if key not in accepted:
            raise EnvKwargsError(
                f"env.kwargs.config.{key}: reasoning-gym's {dataset} takes no {key!r}"
                f"{_did_you_mean(key, accepted)}; it takes: {', '.join(accepted)}"
            )


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class ReasoningGymEnv(SingleTurnEnv):
    """One reasoning-gym dataset as a single-turn environment (see the module docstring).

    Args:
        dataset: a reasoning-gym dataset name (``leg_counting``, ``chain_sum``, ...).
        config: keyword arguments of that dataset's config.
        system_prompt: the system message; None for none.
        format_penalty: reward lost when no final answer is found.
    """

    env_id = ENV_ID
    expected_answer = "<answer>…</answer>"
    """What the grader extracts an answer from (`rldojo.training.signal` names it)."""

    def __init__(
        self,
        dataset: str = "leg_counting",
        *,
        config: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        format_penalty: float = 0.0,
    ) -> None:
        super().__init__()
        self.rg = _reasoning_gym()
        self.dataset = dataset
        self.config = dict(config or {})
        _check_dataset(self.rg, dataset, self.config)
        self.system_prompt = system_prompt
        self.format_penalty = format_penalty

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in DEFAULT_N:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        size = DEFAULT_N[split] if n is None else n
        if size <= 0:
            return []
        rg_seed = seed + (TEST_SEED_OFFSET if split == "test" else 0)
        data = self.rg.create_dataset(self.dataset, seed=rg_seed, size=size, **self.config)
        source = (self.dataset, rg_seed, size, tuple(sorted(self.config.items())))
        return [
            Task(
                id=f"{ENV_ID}/{self.dataset}/{split}/{seed}/{i}",
                prompt=f"{entry['question']}\n\n{INSTRUCTION}",
                answer=None if entry.get("answer") is None else str(entry["answer"]),
                info={"dataset": self.dataset, "entry": entry, "source": source},
                env=ENV_ID,
            )
            for i, entry in enumerate(data)
        ]

    def default_grader(self) -> ReasoningGymGrader:
        return ReasoningGymGrader(format_penalty=self.format_penalty)


register(ENV_ID, ReasoningGymEnv)
