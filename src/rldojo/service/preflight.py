"""Checks before a reinforcement job trains: can its grader score, will its rollouts teach?

`grader_preflight(spec, path, name, settings)` runs at job creation (`POST
/v1/fine_tuning/jobs`, in the service process): the first `preflight_rows` rows of the
training file, each with the row's reference answer as the model's output (`answer` or
`reference_answer`; else `FIXED_SAMPLE`), graded by the job's grader. When every one
errors (the grader raised, not a low score), the job is refused: `ApiError(400, code
"grader_failures")` naming the first error. Rows the file check will refuse later (bad
messages) are left to it. `graders/validate` runs the same check on an `item` it is given
(`preflight_scores`).

`signal_check(config_toml, ...)` runs in the job's worker before step 1 of a new job: a
few prompts, each sampled a few times by the base model (small token budget, the run's
temperature), graded. GRPO learns only from groups whose rewards differ, so the share of
groups with reward variance says how much signal the first steps carry. `signal_event`
turns the result into the job event (a warning when little or no signal is expected).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from rldojo.service.errors import ApiError
from rldojo.service.settings import ServiceSettings

__all__ = ["FIXED_SAMPLE", "grader_preflight", "preflight_scores", "signal_check", "signal_event"]

FIXED_SAMPLE = "42"
"""The model output graded for a row that gives no reference answer."""
GRADE_TIMEOUT_S = 30.0
"""Per-row grading limit of the preflight; a timeout is not counted as an error."""


def _sample_of(row: Mapping[str, Any]) -> str:
    answer = row.get("reference_answer", row.get("answer"))
    if answer is None:
        return FIXED_SAMPLE
    return answer if isinstance(answer, str) else json.dumps(answer)


async def preflight_scores(
    grader: Any, items: list[tuple[int, Mapping[str, Any], str]]
) -> list[Any]:
    """Scores of `(line, row, sample text)` graded by a loaded grader, in order."""
    from rldojo.service.rft_env import row_task
    from rldojo.types import Rollout, Score

    async def one(line: int, row: Mapping[str, Any], text: str) -> Any:
        task = row_task(line, row, "train", "preflight")
        rollout = Rollout(
            task_id=task.id,
            env=task.env,
            completion=text,
            messages=[*task.prompt, {"role": "assistant", "content": text}],
        )
        try:
            return await asyncio.wait_for(grader.grade(rollout, task), GRADE_TIMEOUT_S)
        except TimeoutError:
            return Score.failed("timeout", f"took longer than {GRADE_TIMEOUT_S:g}s")
        except Exception as exc:
            return Score.failed("error", f"{type(exc).__name__}: {exc}")

    return list(await asyncio.gather(*(one(*item) for item in items)))


def _first_rows(path: str, n: int) -> list[tuple[int, dict[str, Any]]]:
    """The first `n` rows whose messages are good (the rest are the file check's)."""
    from rldojo.data.loading import DataError, read_rows
    from rldojo.service.rft_env import row_task

    rows = []
    try:
        for line, row in read_rows(path):
            try:
                row_task(line, row, "train", path)
            except DataError:
                continue
            rows.append((line, row))
            if len(rows) >= n:
                break
    except (DataError, OSError):
        pass
    return rows


def grader_preflight(spec: Any, path: str, name: str, settings: ServiceSettings) -> None:
    """Refuse a grader that errors on every one of the first rows (module docstring)."""
    from rldojo.service.judge import load_grader

    param = "method.reinforcement.grader"
    rows = _first_rows(path, settings.preflight_rows) if settings.preflight_rows > 0 else []
    if not rows:
        return
    grader = load_grader(spec, settings, param)

    async def run() -> list[Any]:
        try:
            return await preflight_scores(grader, [(ln, r, _sample_of(r)) for ln, r in rows])
        finally:
            await grader.close()

    scores = asyncio.run(run())
    if all(s.status == "error" for s in scores):
        why = " ".join(str(scores[0].explanation).split())[:300]
        raise ApiError(
            400,
            f"{param}: the grader failed on each of the first {len(rows)} rows of {name} "
            f"(graded with each row's reference answer); line {rows[0][0]}: {why}",
            param=param,
            code="grader_failures",
        )


def signal_check(
    config_toml: str, judge_api_key: str | None, prompts: int, samples: int, max_tokens: int
) -> dict[str, Any]:
    """In the job's worker: `prompts` training prompts x `samples` samples of the base
    model, graded; counts for `signal_event`."""
    import time

    from rldojo.envs.base import SingleTurnEnv
    from rldojo.graders.specs.loading import load
    from rldojo.policy.models import load_model
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.rollout.engine import collect_rollouts, grade_rollouts
    from rldojo.service.rft_env import RftEnv
    from rldojo.service.runner import config_of, use_judge_key
    from rldojo.types import SamplingParams

    started = time.perf_counter()
    config = config_of(config_toml)
    use_judge_key(judge_api_key)
    env = RftEnv(**config.env.kwargs)
    tasks = list(env.tasks("train", seed=config.run.seed, n=prompts))
    model, tokenizer = load_model(config.model.name)
    policy = TransformersPolicy(model, tokenizer, generation_dtype=None)
    params = SamplingParams(
        max_new_tokens=max_tokens, temperature=config.sampling.temperature, seed=config.run.seed
    )
    episodes = [(t, i, config.run.seed + i) for t in tasks for i in range(samples)]
    grader = load(config.grader.spec or {})
    threshold = float(grader.pass_threshold)

    async def run() -> list[Any]:
        try:
            rollouts = await collect_rollouts(SingleTurnEnv, policy, episodes, params)
            return await grade_rollouts(grader, rollouts, [t for t, _, _ in episodes])
        finally:
            await grader.close()

    scores = asyncio.run(run())
    return _counts(scores, samples, threshold, time.perf_counter() - started)


def _counts(scores: list[Any], samples: int, threshold: float, wall_s: float) -> dict[str, Any]:
    ok = [s.value if s.status == "ok" and s.value is not None else None for s in scores]
    groups = [ok[i : i + samples] for i in range(0, len(ok), samples)]
    varied = sum(1 for g in groups if len({v for v in g if v is not None}) > 1)
    errors = [s for s in scores if s.status != "ok"]
    return {
        "samples": len(scores),
        "passed": sum(1 for v in ok if v is not None and v >= threshold),
        "errors": len(errors),
        "first_error": " ".join(str(errors[0].explanation).split())[:300] if errors else None,
        "groups": len(groups),
        "groups_with_variance": varied,
        "pass_threshold": threshold,
        "wall_s": round(wall_s, 2),
    }


def signal_event(result: Mapping[str, Any]) -> tuple[str, str]:
    """(message, level) of the learning-signal event; `warn` when little signal is expected."""
    n, passed, groups, varied = (
        result[k] for k in ("samples", "passed", "groups", "groups_with_variance")
    )
    head = (
        f"Learning-signal check: the base model passes {passed} of {n} samples; "
        f"{varied} of {groups} groups have rewards that differ"
    )
    if result["errors"] == n:
        return f"{head}; the grader failed on every sample: {result['first_error']}", "warn"
    if varied == 0:
        return (
            f"{head}: no learning signal expected (GRPO learns from groups whose rewards "
            "differ); graders with partial credit learn faster",
            "warn",
        )
    if varied * 4 < groups:
        return (
            f"{head}: little learning signal expected; graders with partial credit learn faster",
            "warn",
        )
    return head, "info"
