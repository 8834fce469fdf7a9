"""The `--set` overrides of a tiny training run, shared by the tests that train.

`TINY` is the common core: `tiny-random` in float32, two prompts of two samples each, four
new tokens, no held-out evaluation. A test states only what it changes:

    tiny_overrides("env.id=coin-v1", "rollout.group_size=4", f"run.output_dir={tmp_path}")

Each `key=value` replaces the core's entry for that key or is appended; `drop` leaves a
core key at the config's default.
"""

from __future__ import annotations

from collections.abc import Iterable

TINY = (
    "model.name=tiny-random",
    "model.autocast_bf16=false",  # float32 on every CPU: runs compare bit for bit
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.dynamic_sampling=false",  # one round a step, whatever the rewards
    "sampling.max_new_tokens=4",
    "eval.tasks=0",
)


def _key(item: str) -> str:
    return item.partition("=")[0].strip()


def tiny_overrides(*sets: str, drop: Iterable[str] = ()) -> list[str]:
    """`TINY` with `sets` applied (a later `key=value` wins, as with `--set`) and the keys
    in `drop` removed."""
    dropped = set(drop)
    unknown = dropped - {_key(item) for item in TINY}
    if unknown:
        raise ValueError(f"drop: {sorted(unknown)} not in TINY")
    merged = {_key(item): item for item in TINY if _key(item) not in dropped}
    for item in sets:
        merged[_key(item)] = item
    return list(merged.values())
