"""reasoning-gym-v1: reasoning-gym's procedural datasets as rldojo environments.

    env = make_env("reasoning-gym-v1", dataset="leg_counting", config={"min_animals": 2})
    env = make_env("reasoning-gym-v1", datasets={"leg_counting": 1, "basic_arithmetic": 2})

Needs the optional extra ``rldojo[reasoning-gym]``; without it `make_env` raises
`OptionalDependencyError` saying so. Tasks come from ``reasoning_gym.create_dataset(name,
seed=..., size=n, **config)``; the train split uses the seed as given and the test split
``seed + TEST_SEED_OFFSET``, so the two are different draws (for datasets with a small
space of questions they may still overlap).

With `datasets` (name -> weight), each task's dataset is drawn by weight from a generator
seeded by the split's seed, then each dataset makes as many tasks as it was drawn, in
order; every task records its dataset (`Task.info["dataset"]`) and is graded by that
dataset's scorer (`rldojo.envs.reasoning_gym.grader`). Unknown dataset names and config
keys are one-line `EnvKwargsError`s with the closest name, raised when the environment is
built (a run builds its environments before it loads the model).

The policy is asked for ``<answer>...</answer>``; the forms a small model writes instead
are accepted too (`final_answer`). `reference_reply` writes a task's reference answer in
the requested form, for demonstrations (``rldojo demos ... --from-answers``).
"""

from __future__ import annotations

import dataclasses
import difflib
import random
from collections.abc import Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

from pydantic import Field, model_validator

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.kwargs import EnvKwargs, given_kwargs
from rldojo.envs.reasoning_gym.grader import (
    OptionalDependencyError,
    ReasoningGymGrader,
    final_answer,
    reasoning_gym,
)
from rldojo.envs.registry import EnvKwargsError, register
from rldojo.types import Task

__all__ = [
    "OptionalDependencyError",
    "ReasoningGymEnv",
    "ReasoningGymGrader",
    "ReasoningGymKwargs",
    "dataset_names",
    "draw_counts",
    "final_answer",
]

ENV_ID = "reasoning-gym-v1"
TEST_SEED_OFFSET = 1_000_003
DEFAULT_N = {"train": 1000, "test": 200}
INSTRUCTION = "Think it through, then give only the final answer in <answer>...</answer>."


def _registry(rg: ModuleType) -> dict[str, Any] | None:
    """reasoning-gym's ``factory.DATASETS`` (name -> (dataset class, config class)), or
    None for a reasoning-gym without it."""
    registry = getattr(getattr(rg, "factory", None), "DATASETS", None)
    return registry if isinstance(registry, dict) else None


def dataset_names() -> list[str]:
    """The dataset names of the installed reasoning-gym, sorted (`rldojo envs
    --reasoning-gym`); `OptionalDependencyError` when it is not installed."""
    return sorted(_registry(reasoning_gym()) or {})


def _check_dataset(rg: ModuleType, dataset: str, config: Mapping[str, object], key: str) -> None:
    """An unknown dataset or config key is an `EnvKwargsError` naming the key (`key`: the
    kwarg that named the dataset), with the closest name. reasoning-gym itself says only
    "Dataset 'chain_sumx' not registered", when the first tasks are drawn. A reasoning-gym
    without the `factory.DATASETS` registry is not checked: `create_dataset` says."""
    registry = _registry(rg)
    if registry is None:
        return
    if dataset not in registry:
        raise EnvKwargsError(
            f"env.kwargs.{key}: reasoning-gym has no dataset {dataset!r}"
            f"{_did_you_mean(dataset, registry)}"
        )
    config_cls = registry[dataset][1]
    if not dataclasses.is_dataclass(config_cls):
        return
    # seed and size are the environment's to set, per split
    accepted = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    where = "config" if key == "dataset" else f"configs.{dataset}"
    for name in config:
        if name not in accepted:
            raise EnvKwargsError(
                f"env.kwargs.{where}.{name}: reasoning-gym's {dataset} takes no {name!r}"
                f"{_did_you_mean(name, accepted)}; it takes: {', '.join(accepted)}"
            )


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_weights(datasets: Mapping[str, object]) -> dict[str, float]:
    """`datasets` as name -> weight; a weight that is not a number > 0 is one line."""
    if not datasets:
        raise EnvKwargsError("env.kwargs.datasets: name at least one dataset")
    weights: dict[str, float] = {}
    for name, weight in datasets.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise EnvKwargsError(
                f"env.kwargs.datasets.{name}: a weight must be a number > 0, got {weight!r}"
            )
        weights[str(name)] = float(weight)
    return weights


def draw_counts(weights: Mapping[str, float], size: int, seed: int) -> list[str]:
    """The dataset of each of `size` tasks, drawn by weight with `random.Random(seed)`."""
    names = list(weights)
    return random.Random(seed).choices(names, weights=[weights[n] for n in names], k=size)


class ReasoningGymKwargs(EnvKwargs):
    """The kwargs of reasoning-gym-v1 (dataset names and config keys are checked against
    reasoning-gym's registry when the environment is built)."""

    dataset: str | None = None
    """One reasoning-gym dataset (``leg_counting``, ``chain_sum``, ...; `rldojo envs
    --reasoning-gym` lists them); ``leg_counting`` when neither this nor `datasets`."""
    datasets: dict[str, float] | None = None
    """A weighted mix instead, name -> weight: ``{leg_counting = 1, basic_arithmetic = 2}``."""
    config: dict[str, object] | None = None
    """Keyword arguments of `dataset`'s config (not ``seed``/``size``: set per split)."""
    configs: dict[str, dict[str, object]] | None = None
    """Per dataset of the mix, keyword arguments of its config."""
    system_prompt: str | None = None
    """The system message; None for none."""
    format_penalty: float = Field(0.0, ge=0)
    """Reward lost when no final answer is found (0: the value is the dataset's score)."""

    @model_validator(mode="after")
    def _one_way(self) -> ReasoningGymKwargs:
        if self.datasets is not None and (self.dataset is not None or self.config):
            raise ValueError(
                "give either dataset (with config) or datasets (with configs), not both"
            )
        return self


class ReasoningGymEnv(SingleTurnEnv):
    """One reasoning-gym dataset, or a weighted mix of several, as a single-turn
    environment (see the module docstring); built from `ReasoningGymKwargs` (or keywords
    validated against it)."""

    Kwargs = ReasoningGymKwargs
    env_id = ENV_ID
    expected_answer = "<answer>…</answer>"
    """What the grader extracts an answer from (`rldojo.training.no_signal` names it)."""

    def __init__(self, kwargs: ReasoningGymKwargs | None = None, /, **keywords: object) -> None:
        super().__init__()
        k = self.kwargs = given_kwargs(ENV_ID, ReasoningGymKwargs, kwargs, keywords)
        self.rg = reasoning_gym()
        if k.datasets is None:
            self.dataset = k.dataset or "leg_counting"
            self.weights = {self.dataset: 1.0}
            self.configs = {self.dataset: dict(k.config or {})}
            _check_dataset(self.rg, self.dataset, self.configs[self.dataset], "dataset")
        else:
            self.weights = _check_weights(k.datasets)
            self.dataset = ",".join(self.weights)
            self.configs = {name: dict((k.configs or {}).get(name) or {}) for name in self.weights}
            for name in k.configs or {}:
                if name not in self.weights:
                    raise EnvKwargsError(
                        f"env.kwargs.configs.{name}: {name!r} is not one of "
                        f"the datasets ({', '.join(self.weights)})"
                    )
            for name in self.weights:
                _check_dataset(self.rg, name, self.configs[name], f"datasets.{name}")
        self.config = self.configs[next(iter(self.weights))]
        self.system_prompt = k.system_prompt

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        if split not in DEFAULT_N:
            raise ValueError(f"{ENV_ID}: unknown split {split!r}; use 'train' or 'test'")
        size = DEFAULT_N[split] if n is None else n
        if size <= 0:
            return []
        rg_seed = seed + (TEST_SEED_OFFSET if split == "test" else 0)
        if len(self.weights) == 1:
            order = [next(iter(self.weights))] * size
        else:
            order = draw_counts(self.weights, size, rg_seed)
        entries: dict[str, Iterator[tuple[int, dict[str, Any]]]] = {}
        sources: dict[str, tuple[Any, ...]] = {}
        for name in dict.fromkeys(order):
            config, count = self.configs[name], order.count(name)
            data = self.rg.create_dataset(name, seed=rg_seed, size=count, **config)
            entries[name] = iter(enumerate(data))
            sources[name] = (name, rg_seed, count, tuple(sorted(config.items())))
        tasks = []
        for name in order:
            j, entry = next(entries[name])
            tasks.append(
                Task(
                    id=f"{ENV_ID}/{name}/{split}/{seed}/{j}",
                    prompt=f"{entry['question']}\n\n{INSTRUCTION}",
                    answer=None if entry.get("answer") is None else str(entry["answer"]),
                    info={"dataset": name, "entry": entry, "source": sources[name]},
                    env=ENV_ID,
                )
            )
        return tasks

    def reference_reply(self, task: Task) -> str | None:
        """The task's reference answer written as the prompt asks, None without one
        (demonstrations: ``rldojo demos reasoning-gym-v1 --from-answers``)."""
        return None if task.answer is None else f"<answer>{task.answer}</answer>"

    def default_grader(self) -> ReasoningGymGrader:
        return ReasoningGymGrader(format_penalty=self.kwargs.format_penalty)


register(ENV_ID, ReasoningGymEnv)
