"""The task lists of the CRM environments: one scenario per task, on its split's databases.

crm-v1 and web-crm-v1 pose the same kind of task (a request, the expected changes, the
facts to mention; `rldojo.envs.crm.scenarios`) from different template sets. Task ``i``
of a split runs on start database ``i % n_databases`` of that split's range, so the train
and test splits never share a database, and is drawn from
``random.Random(f"{env_id}:{split}:{seed}:{i}")`` alone: the same arguments give the same
tasks.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from rldojo.envs.crm.scenarios import TEMPLATES, Template, make_scenario
from rldojo.types import Task

__all__ = ["DEFAULT_N", "scenario_tasks"]

DEFAULT_N = {"train": 500, "test": 100}
"""Tasks per split when `n` is not given."""
SPLIT_DB_BASE = {"train": 0, "test": 10_000}
"""Train and test tasks run on different databases (seeds from different ranges)."""


def scenario_tasks(
    env_id: str,
    split: str,
    *,
    seed: int,
    n: int | None,
    levels: tuple[int, ...],
    n_databases: int,
    db_size: str,
    templates: Mapping[int, tuple[Template, ...]] = TEMPLATES,
) -> list[Task]:
    """The first `n` tasks (`DEFAULT_N` by default) of `split` (see the module docstring)."""
    if split not in DEFAULT_N:
        raise ValueError(f"{env_id}: unknown split {split!r}; use 'train' or 'test'")
    tasks = []
    for i in range(DEFAULT_N[split] if n is None else n):
        rng = random.Random(f"{env_id}:{split}:{seed}:{i}")
        db_seed = SPLIT_DB_BASE[split] + i % n_databases
        scenario = make_scenario(rng, levels, db_seed, db_size, templates)
        mentions = scenario["mentions"]
        tasks.append(
            Task(
                id=f"{env_id}/{split}/{seed}/{i}",
                prompt=scenario["prompt"],
                answer="; ".join(mentions) if mentions else None,
                info={**scenario, "db": {"seed": db_seed, "size": db_size}},
                env=env_id,
            )
        )
    return tasks
