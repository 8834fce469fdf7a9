"""The operator's judge endpoint for model graders, and grader specs checked for the service.

`rldojo service --judge-base-url URL [--judge-api-key KEY]` (or `RLDOJO_JUDGE_API_KEY`)
lets reinforcement jobs and `/v1/fine_tuning/alpha/graders/{validate,run}` use model
graders (`score_model`, `label_model`, rldojo's `rubric`, `group_judge`): each is
answered by that OpenAI-compatible endpoint, asked for the model its spec's `model`
names (OpenAI's meaning; rldojo's own types name it in `judge.model`). The endpoint
reaches the loader as the wrapper's judge table (`rldojo.graders.load(spec, judge=...)`):

    in the service process   {base_url = URL, api_key_env = "RLDOJO_JUDGE_API_KEY",
                              api_key = KEY}                       (memory only)
    in a job's config.toml   {base_url = URL, api_key_env = "RLDOJO_JUDGE_API_KEY"}

The key is never written down: the job's worker gets it as a call argument and puts it
in its own environment (`rldojo.service.runner.run_job`), where the loader reads it.
With `--ray-address`, rollout workers on the cluster grade, so its nodes need
`RLDOJO_JUDGE_API_KEY` in their environment.

`checked_spec` refuses what a caller must not decide (400): the wrapper form, `cache`,
and judge tables with more than `model` (an endpoint, backend or key: the key would go
wherever a caller pointed it). Without a judge endpoint, a model grader is a 400 that
says to start the service with `--judge-base-url`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rldojo.graders.specs.common import GraderSpecError
from rldojo.service.errors import ApiError
from rldojo.service.settings import ServiceSettings

if TYPE_CHECKING:
    from rldojo.graders.specs.loading import SpecGrader

__all__ = [
    "JUDGED_TYPES",
    "JUDGE_KEY_ENV",
    "checked_spec",
    "judge_table",
    "load_grader",
    "validate_grader",
]

JUDGE_KEY_ENV = "RLDOJO_JUDGE_API_KEY"
"""Where the loader reads the judge's API key (`api_key_env` of the judge table)."""
JUDGED_TYPES = ("score_model", "label_model", "rubric", "group_judge")
"""Grader types that ask a judge model."""


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def judge_table(settings: ServiceSettings, *, with_key: bool) -> dict[str, Any] | None:
    """The judge table of the service's endpoint (None without one). `with_key`: the key
    itself too (the service process only; never in a config that is written)."""
    if not settings.judge_base_url:
        return None
    table: dict[str, Any] = {"base_url": settings.judge_base_url, "api_key_env": JUDGE_KEY_ENV}
    if with_key and settings.judge_api_key:
        table["api_key"] = settings.judge_api_key
    return table


def _tables(spec: Mapping[str, Any], where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field path, table) of the spec and every grader nested in a `multi`."""
    yield where, spec
    subs = spec.get("graders")
    if isinstance(subs, Mapping):
        for name, sub in subs.items():
            if isinstance(sub, Mapping):
                yield from _tables(sub, f"{where}.graders.{name}")


def checked_spec(spec: object, settings: ServiceSettings, param: str) -> dict[str, Any]:
    """`spec` as a dict, if the service accepts it (module docstring); else ApiError(400)."""
    if not isinstance(spec, Mapping):
        raise _bad(f"{param}: missing (an OpenAI grader object)", param)
    if "type" not in spec:
        raise _bad(f"{param}: expected an OpenAI grader object with a 'type'", param)
    for where, table in _tables(spec, param):
        if "cache" in table:
            raise _bad(f"{where}.cache: the judge cache is the service's, not the caller's", param)
        own = table.get("judge")
        if own is not None and (not isinstance(own, Mapping) or set(own) - {"model"}):
            raise _bad(
                f"{where}.judge: the judge endpoint is the service's (rldojo service "
                "--judge-base-url); a grader may only name its model (judge.model)",
                param,
            )
        if table.get("type") in JUDGED_TYPES and not settings.judge_base_url:
            raise _bad(
                f"{where}: a model grader ({table['type']}) needs a judge endpoint: start "
                "the service with --judge-base-url URL (an OpenAI-compatible endpoint that "
                "serves the grader's model)",
                param,
            )
    return dict(spec)


def load_grader(spec: object, settings: ServiceSettings, param: str) -> SpecGrader:
    """The checked spec loaded (`rldojo.graders.load`, the service's judge, no cache);
    ApiError(400) naming `param` for any mistake. Close it with ``await g.close()``."""
    from rldojo.graders.specs.loading import load

    checked = checked_spec(spec, settings, param)
    try:
        return load(checked, judge=judge_table(settings, with_key=True), cache=False)
    except (GraderSpecError, ValueError) as exc:
        raise _bad(f"{param}: {exc}", param) from None


def validate_grader(spec: object, settings: ServiceSettings, param: str) -> dict[str, Any]:
    """`spec` as a dict once it loads (`load_grader`, then closed); ApiError(400)."""
    checked = checked_spec(spec, settings, param)
    grader = load_grader(checked, settings, param)
    asyncio.run(grader.close())
    return checked
