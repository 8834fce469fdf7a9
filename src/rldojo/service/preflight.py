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
temperature), graded (`sample_signal`; `graders/run` runs it too when asked with a
`signal` object). GRPO learns only from groups whose rewards differ, so the share of
groups with reward variance says how much signal the first steps carry. `signal_event`
turns the result into the job event (a warning when little or no signal is expected).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rldojo.service.errors import ApiError
from rldojo.service.settings import ServiceSettings

if TYPE_CHECKING:  # loaded in the functions: the service starts without them
    from rldojo.envs.base import Env
    from rldojo.graders.base import Grader
    from rldojo.graders.specs.loading import SpecGrader
    from rldojo.types import Score

__all__ = ["FIXED_SAMPLE", "grader_preflight", "preflight_scores", "run_signal", "sample_signal",
           "signal_check", "signal_event", "signal_request"]  # fmt: skip

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
    grader: Grader, items: list[tuple[int, Mapping[str, Any], str]]
) -> list[Score]:
    """Scores of `(line, row, sample text)` graded by a loaded grader, in order."""
    from rldojo.service.rft_env import row_task
    from rldojo.types import Rollout, Score

    async def one(line: int, row: Mapping[str, Any], text: str) -> Score:
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


def grader_preflight(spec: object, path: str, name: str, settings: ServiceSettings) -> None:
    """Refuse a grader that errors on every one of the first rows (module docstring)."""
    from rldojo.service.judge import load_grader

    param = "method.reinforcement.grader"
    rows = _first_rows(path, settings.preflight_rows) if settings.preflight_rows > 0 else []
    if not rows:
        return
    grader = load_grader(spec, settings, param)

    async def run() -> list[Score]:
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
    from rldojo.graders.specs.loading import load
    from rldojo.service.rft_env import RftEnv
    from rldojo.service.runner import config_of, use_judge_key

    config = config_of(config_toml)
    use_judge_key(judge_api_key)
    return sample_signal(
        config.model.name,
        RftEnv(**config.env.kwargs),
        load(config.grader.spec or {}),
        prompts=prompts,
        samples=samples,
        max_tokens=max_tokens,
        temperature=config.sampling.temperature,
        seed=config.run.seed,
    )


def sample_signal(
    model: str,
    env: Env,
    grader: SpecGrader,
    *,
    prompts: int,
    samples: int,
    max_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """`prompts` of `env`'s training tasks x `samples` samples of `model`, graded by
    `grader` (closed here); counts for `signal_event`. Runs its own event loop: call it
    from a worker or a thread."""
    import time

    from rldojo.envs.base import SingleTurnEnv
    from rldojo.policy.models import load_model
    from rldojo.policy.transformers_backend import TransformersPolicy
    from rldojo.rollout.episodes import collect_rollouts, grade_rollouts
    from rldojo.types import SamplingParams

    started = time.perf_counter()
    tasks = list(env.tasks("train", seed=seed, n=prompts))
    loaded, tokenizer = load_model(model)
    policy = TransformersPolicy(loaded, tokenizer, generation_dtype=None)
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, seed=seed)
    episodes = [(t, i, seed + i) for t in tasks for i in range(samples)]
    threshold = float(grader.pass_threshold)

    async def run() -> list[Score]:
        try:
            rollouts = await collect_rollouts(SingleTurnEnv, policy, episodes, params)
            return await grade_rollouts(grader, rollouts, [t for t, _, _ in episodes])
        finally:
            await grader.close()

    scores = asyncio.run(run())
    return _counts(scores, samples, threshold, time.perf_counter() - started)


SIGNAL_MAX = 16
"""Most prompts, and most samples a prompt, that `graders/run` samples when asked."""


def signal_request(
    ask: object,
    who: str,
    source_of: Callable[[str, str], str],
    file_of: Callable[[str, str], dict[str, Any] | None],
    settings: ServiceSettings,
) -> tuple[str, dict[str, Any], dict[str, int]]:
    """The checked `signal` object of a `graders/run` request: (what loads the model, the
    training file's row, {prompts, samples}); `ApiError` 400/404 otherwise. `source_of`
    and `file_of` resolve a model name and a file id for the caller `who`."""
    if not isinstance(ask, Mapping) or not all(
        isinstance(ask.get(k), str) for k in ("model", "training_file")
    ):
        raise ApiError(
            400,
            'signal: expected {"model": NAME, "training_file": FILE_ID, '
            '"prompts"?: int, "samples"?: int}',
            param="signal",
        )
    sizes = {
        "prompts": ask.get("prompts", settings.signal_prompts or 4),
        "samples": ask.get("samples", settings.signal_samples),
    }
    for key, n in sizes.items():
        if not isinstance(n, int) or not 1 <= n <= SIGNAL_MAX:
            raise ApiError(
                400, f"signal.{key}: expected 1..{SIGNAL_MAX}, got {n!r}", param=f"signal.{key}"
            )
    row = file_of(who, ask["training_file"])
    if row is None:
        raise ApiError(
            404,
            f"No such file: {ask['training_file']!r}",
            param="signal.training_file",
            code="not_found",
        )
    return source_of(who, ask["model"]), row, sizes


def run_signal(
    source: str,
    row: Mapping[str, Any],
    sizes: Mapping[str, int],
    spec: object,
    settings: ServiceSettings,
) -> dict[str, Any]:
    """`graders/run`'s learning-signal check, in a thread of the service: the counts, the
    event's `message` and its `level`."""
    from rldojo.data.loading import DataError
    from rldojo.service.judge import load_grader
    from rldojo.service.rft_env import RftEnv

    try:
        env = RftEnv(train_path=str(row["path"]), name=str(row["filename"]))
    except DataError as exc:
        raise ApiError(400, f"signal.training_file: {exc}", param="signal.training_file") from None
    grader = load_grader(spec, settings, "grader")
    result = sample_signal(source, env, grader, max_tokens=settings.signal_max_tokens, **sizes)
    message, level = signal_event(result)
    return {**result, "message": message, "level": level}


def _counts(scores: list[Score], samples: int, threshold: float, wall_s: float) -> dict[str, Any]:
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
