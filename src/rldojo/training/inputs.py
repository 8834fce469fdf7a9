"""The run's inputs, built and checked before anything is written or loaded.

Every run (`rldojo.training.run.Run`) and `rldojo train --dry-run`
(`rldojo.training.dry_run`) build them here: the environments of `[env]` (ids, kwargs,
data files, each built once) with the grader spec's grader if one replaces theirs, the
curriculum over their training tasks, the run's pass threshold. A mistake is a one-line
error (`EnvKwargsError`, `DataError`, `TemplateError`, `ConfigError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rldojo.config import TrainConfig

if TYPE_CHECKING:
    from rldojo.data.curriculum import Curriculum
    from rldojo.rollout.mixture import EnvMixture


def env_entries(config: TrainConfig) -> list[tuple[str, dict[str, Any], float]]:
    """`(env id, kwargs, weight)` of every environment the run draws from."""
    return [(e.id, e.kwargs, e.weight) for e in config.env.mix] or [
        (config.env.id, config.env.kwargs, 1.0)
    ]


def build_mixture(config: TrainConfig) -> EnvMixture:
    """The run's environments (each built once: ids, kwargs and data files checked) with
    the grader spec's grader, if one replaces the environments' own."""
    from rldojo.graders import load
    from rldojo.rollout.mixture import EnvMixture

    grader = None if config.grader.spec is None else load(config.grader.spec)
    mixture = EnvMixture(
        env_entries(config),
        seed=config.run.seed,
        train_n=config.env.train_tasks,
        test_n=config.eval.tasks,
        grader=grader,
    )
    if grader is not None:
        check_task_templates(grader.spec, mixture)
    check_episodes_at_once(config, mixture)
    return mixture


def check_episodes_at_once(config: TrainConfig, mixture: EnvMixture) -> None:
    """`EnvKwargsError` if a batch opens more episodes of an environment at once than it
    holds (`max_episodes_at_once`, e.g. web-crm-v1's browser contexts) under the
    lockstep engine, which starts every episode of a batch before its first turn, so the
    rest would wait for a slot until they time out. The episodes engine (a native policy
    in this process) opens each episode when a slot is free: any batch size runs."""
    import math

    from rldojo.envs.kwargs import EnvKwargsError

    ro = config.rollout
    local = config.run.cluster == "local"  # Ray's rollout workers play lockstep
    if ro.engine == "episodes" and config.generation.backend == "native" and local:
        return
    train = math.ceil(ro.prompts_per_step * ro.oversample) * ro.group_size
    for slot in mixture.slots.values():
        if slot.max_at_once is None:
            continue
        limit, key = slot.max_at_once
        for what, n in (
            ("eval.tasks", len(slot.test_tasks)),
            ("rollout.prompts_per_step x group_size", train),
        ):
            if n > limit:
                raise EnvKwargsError(
                    f"env.kwargs.{key}: {slot.env_id} holds {limit} episodes at once, but "
                    f"{what} starts {n} together (before the first turn); lower that or "
                    f"raise env.kwargs.{key}"
                )


TEMPLATE_CHECK_TASKS = 32
"""Training tasks per environment the grader spec's `item` templates are checked against."""


def build_curriculum(
    config: TrainConfig, mixture: EnvMixture, threshold: float
) -> Curriculum | None:
    """The online curriculum over the mixture's train tasks (`[curriculum]`; None when
    off); a task passes at `curriculum.pass_threshold`, else the run's `threshold`."""
    c = config.curriculum
    if not c.enabled:
        return None
    from rldojo.data.curriculum import Curriculum, CurriculumConfig

    tasks = [t for slot in mixture.slots.values() for t in slot.train_tasks]
    knobs = CurriculumConfig(
        window=c.window,
        mode=c.mode,
        saturated_weight=c.saturated_weight,
        pass_threshold=threshold if c.pass_threshold is None else c.pass_threshold,
    )
    return Curriculum(tasks, knobs)


def check_task_templates(spec: Mapping[str, Any], mixture: EnvMixture) -> None:
    """`TemplateError` if an `{{item.x}}` of the spec resolves in none of the first tasks
    of an environment, or a `{{sample.x}}` names a key no sample has. Model output is not
    known before sampling, so `sample` paths are checked by their first key only."""
    from rldojo.graders.openai_templates import item_view
    from rldojo.graders.template_check import check_spec_templates

    for env_id, slot in mixture.slots.items():
        tasks = slot.train_tasks[:TEMPLATE_CHECK_TASKS]
        views: list[tuple[dict[str, Any], dict[str, Any]]] = [({}, item_view(t)) for t in tasks]
        check_spec_templates(
            spec,
            views,
            f"the first {len(tasks)} tasks of env {env_id}",
            sample_keys=("output_text", "output_json"),
        )


def pass_threshold(config: TrainConfig, mixture: EnvMixture) -> float:
    """The run's pass threshold: `grader.pass_threshold`, else the spec's, else 1.0."""
    if config.grader.pass_threshold is not None:
        return config.grader.pass_threshold
    if config.grader.spec is not None:  # every slot holds the one spec grader
        from rldojo.graders.base import pass_threshold_of

        slot = next(iter(mixture.slots.values()))
        return pass_threshold_of(slot.grader)
    return 1.0


def check_inputs(config: TrainConfig) -> Any:
    """Validate the environments, data files, grader spec and model name; returns the
    environment mixture. Raises the one-line user errors the CLI reports."""
    from rldojo.policy.models import check_model
    from rldojo.report.trackers import check_report_to

    check_report_to(config.run.report_to)
    mixture = build_mixture(config)
    check_model(config.model.name)
    return mixture
