"""Where a config's experience is made: which engine plays the episodes, where the
inference engine runs, and how generation and training share the machine
(`rldojo doctor --config FILE` prints it). A description of what the code does for that
config, read from the same keys the run reads; nothing here decides."""

from __future__ import annotations

from rldojo.config import TrainConfig

__all__ = ["placement"]


def _engine(cfg: TrainConfig) -> str:
    ro, backend = cfg.rollout, cfg.generation.backend
    if ro.engine == "lockstep":
        return "lockstep: one generate call per turn for every live episode"
    if backend != "native":
        return f"lockstep: the {backend} backend has no continuous engine here"
    return (
        "episodes: each episode its own coroutine; its turns join the running decode "
        "batch of the transformers engine; graded as it ends"
    )


def _inference(cfg: TrainConfig) -> str:
    ro, backend = cfg.rollout, cfg.generation.backend
    name = "vLLM" if backend == "vllm" else "transformers"
    if cfg.run.cluster == "ray":
        gpus = f", {ro.worker_gpus:g} GPU each" if ro.worker_gpus else ""
        where = f"{name} in each of {ro.workers} Ray rollout workers{gpus}"
        return f"{where}; new weights sent after each update"
    return f"{name} in the trainer's process"


def _sharing(cfg: TrainConfig) -> str:
    lag = cfg.rollout.max_policy_lag
    overlap = (
        f"generation runs ahead of training by up to {lag} update(s) (a producer thread)"
        if lag
        else "generation, then training, each step"
    )
    if cfg.run.shard != "none":
        overlap += "; on several ranks, rank 0 samples from a whole copy while the others wait"
    return overlap


def placement(cfg: TrainConfig) -> list[tuple[str, str]]:
    """`(what, where)` rows: the episode engine, the inference engine, their sharing."""
    return [
        ("rollout engine", _engine(cfg)),
        ("inference", _inference(cfg)),
        ("generation and training", _sharing(cfg)),
    ]
