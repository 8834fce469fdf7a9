"""A fine-tuning job request, checked, and the rldojo training config it becomes.

`parse_create(body, ...)` checks `POST /v1/fine_tuning/jobs` (model allowed, files owned,
method, grader spec loadable, hyperparameters typed, the grader able to score the first
training rows: `rldojo.service.preflight.grader_preflight`) and raises `ApiError(400)`
naming the field. A request without `method` is supervised (OpenAI's default), with the legacy
top-level `hyperparameters`.

Reinforcement (`method.type = "reinforcement"`): `resolve_hyperparameters` turns OpenAI's
hyperparameters, `"auto"` included, into numbers (reported back in the job object);
`train_config` maps them onto rldojo's `TrainConfig` (`rldojo train`):

    batch_size               rollout.prompts_per_step     auto: min(8, training rows)
    n_epochs                 run.steps = ceil(n_epochs x rows / batch_size)   auto: 1
    learning_rate_multiplier optim.lr = 2e-5 x multiplier                     auto: 1.0
    compute_multiplier       rollout.group_size = max(2, round(4 x multiplier)) auto: 1.0
    reasoning_effort         sampling.max_new_tokens: low 32, medium 64, high 128   auto: medium
    eval_interval            eval.every and run.checkpoint_every (steps)      auto: 1
    eval_samples             eval.tasks: held-out rows evaluated (validation file only)
                                                                           auto: all, at most 32

With `ray_address` (`rldojo service --ray-address`) the job's rollout workers run on that
Ray cluster (`run.cluster = "ray"`, `run.ray_address`). With a judge endpoint
(`--judge-base-url`), `grader.spec` is the wrapper ``{grader, judge, cache = false}``
whose judge table names the endpoint and `RLDOJO_JUDGE_API_KEY`, never the key
(`rldojo.service.judge`).

Supervised (`method.type = "supervised"`): `resolve_supervised` and `sft_config` map them
onto the config of `rldojo sft` (`rldojo.training.sft.run_sft`):

    n_epochs                 run.epochs                                       auto: 3
    batch_size               sft.batch_size (examples per optimizer step)     auto: min(16, rows)
    learning_rate_multiplier optim.lr = 5e-5 x multiplier                     auto: 1.0
    (steps reported)         n_epochs x ceil(rows / batch_size)

Every row trains (`sft.only_passed = false`), no held-out environment (`eval.tasks = 0`);
a validation file gives the loss on its rows after training (`full_valid_loss`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rldojo.config import TrainConfig
from rldojo.service.errors import ApiError
from rldojo.service.judge import validate_grader
from rldojo.service.preflight import grader_preflight
from rldojo.service.rft_env import ENV_ID
from rldojo.service.settings import ServiceSettings
from rldojo.service.state import ServiceState

__all__ = [
    "parse_create",
    "resolve_hyperparameters",
    "resolve_supervised",
    "sft_config",
    "train_config",
]

_HYPER = {
    "batch_size": int,
    "n_epochs": int,
    "learning_rate_multiplier": float,
    "compute_multiplier": float,
    "eval_interval": int,
    "eval_samples": int,
    "reasoning_effort": str,
}
_SUPERVISED = {"batch_size": int, "n_epochs": int, "learning_rate_multiplier": float}
_EFFORT_TOKENS = {"low": 32, "medium": 64, "default": 64, "high": 128}
_SUFFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
BASE_LR = 2e-5
SFT_BASE_LR = 5e-5


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _hyperparameters(
    raw: object, known: Mapping[str, type] = _HYPER, where: str = "method.reinforcement"
) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _bad(f"{where}.hyperparameters: expected an object", f"{where}.hyperparameters")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        param = f"{where}.hyperparameters.{key}"
        if key not in known:
            raise _bad(f"{param}: unknown hyperparameter (known: {', '.join(known)})", param)
        kind = known[key]
        if value is None or value == "auto":
            continue
        if key == "reasoning_effort":
            if value not in _EFFORT_TOKENS:
                raise _bad(f"{param}: expected one of {', '.join(_EFFORT_TOKENS)}", param)
        elif isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise _bad(f"{param}: expected 'auto' or a positive number, got {value!r}", param)
        elif kind is int and value != int(value):
            raise _bad(f"{param}: expected an integer, got {value!r}", param)
        out[key] = kind(value)
    return out


def _grader(spec: object, settings: ServiceSettings) -> dict[str, Any]:
    """The grader spec, once it loads with the service's judge (`rldojo.service.judge`)."""
    return validate_grader(spec, settings, "method.reinforcement.grader")


def _file(state: ServiceState, owner: str, file_id: object, param: str) -> str:
    row = state.file(owner, file_id) if isinstance(file_id, str) else None
    if row is None:
        raise _bad(f"{param}: no such file: {file_id!r}", param)
    if row["purpose"] != "fine-tune":
        raise _bad(f"{param}: {file_id} has purpose {row['purpose']!r}, not 'fine-tune'", param)
    return str(file_id)


def _method(body: Mapping[str, Any], settings: ServiceSettings) -> dict[str, Any]:
    """The checked `method` (the grader loaded, hyperparameters typed)."""
    method = body.get("method")
    if method is None:  # OpenAI's default: supervised, legacy top-level hyperparameters
        method = {
            "type": "supervised",
            "supervised": {"hyperparameters": body.get("hyperparameters")},
        }
    if not isinstance(method, Mapping) or "type" not in method:
        raise _bad("method: expected {'type': 'supervised' | 'reinforcement', ...}", "method")
    kind = method["type"]
    if kind not in ("supervised", "reinforcement"):
        raise _bad(
            f"method.type: {kind!r} is not supported; use 'supervised' or 'reinforcement'",
            "method.type",
        )
    section = method.get(kind) or ({} if kind == "supervised" else None)
    if not isinstance(section, Mapping):
        raise _bad(f"method.{kind}: missing", f"method.{kind}")
    if kind == "supervised":
        hyper = _hyperparameters(section.get("hyperparameters"), _SUPERVISED, "method.supervised")
        return {"type": kind, kind: {"hyperparameters": hyper}}
    grader = _grader(section.get("grader"), settings)
    hyper = _hyperparameters(section.get("hyperparameters"))
    return {"type": kind, kind: {"grader": grader, "hyperparameters": hyper}}


def parse_create(
    body: Mapping[str, Any], settings: ServiceSettings, state: ServiceState, owner: str
) -> dict[str, Any]:
    """The job's stored fields from a create request (module docstring); ApiError(400)."""
    model = body.get("model")
    if not isinstance(model, str) or model not in settings.base_models:
        allowed = ", ".join(settings.base_models)
        raise _bad(f"model: {model!r} is not a model this service fine-tunes ({allowed})", "model")
    training = _file(state, owner, body.get("training_file"), "training_file")
    validation = body.get("validation_file")
    if validation is not None:
        validation = _file(state, owner, validation, "validation_file")
    suffix = body.get("suffix")
    if suffix is not None and (not isinstance(suffix, str) or not _SUFFIX.match(suffix)):
        raise _bad("suffix: 1-64 letters, digits, '-' or '_'", "suffix")
    seed = body.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise _bad("seed: expected an integer", "seed")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
        for k, v in metadata.items()
    ):
        raise _bad("metadata: expected string keys (<=64) and string values (<=512)", "metadata")
    method = _method(body, settings)
    row = state.file(owner, training)
    if method["type"] == "reinforcement" and row is not None:  # can the grader score rows?
        grader_preflight(method["reinforcement"]["grader"], row["path"], row["filename"], settings)
    return {
        "model": model,
        "training_file": training,
        "validation_file": validation,
        "suffix": suffix,
        "seed": seed,
        "metadata": dict(metadata),
        "method": method,
    }


def resolve_hyperparameters(asked: Mapping[str, Any], rows: int, val_rows: int) -> dict[str, Any]:
    """Every hyperparameter as a value, `"auto"` resolved (module docstring)."""
    batch = int(asked.get("batch_size") or min(8, rows))
    epochs = int(asked.get("n_epochs") or 1)
    return {
        "batch_size": batch,
        "n_epochs": epochs,
        "learning_rate_multiplier": float(asked.get("learning_rate_multiplier") or 1.0),
        "compute_multiplier": float(asked.get("compute_multiplier") or 1.0),
        "reasoning_effort": str(asked.get("reasoning_effort") or "medium"),
        "eval_interval": int(asked.get("eval_interval") or 1),
        "eval_samples": int(asked.get("eval_samples") or min(32, val_rows)),
        "steps": max(1, math.ceil(epochs * rows / batch)),
    }


def train_config(
    job: Mapping[str, Any],
    hyper: Mapping[str, Any],
    paths: Mapping[str, Any],
    jobs_dir: Path,
    threads: int | None,
    ray_address: str | None = None,
    judge: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """The rldojo config a reinforcement job trains with; `paths` holds the stored files
    and names; `ray_address`: rollout workers on that Ray cluster; `judge`: the judge
    table model graders use (`rldojo.service.judge.judge_table`, without the key)."""
    validation = paths.get("validation_path")
    grader = job["method"]["reinforcement"]["grader"]
    spec: dict[str, Any] = {"grader": grader, "cache": False}
    if judge is not None:
        spec["judge"] = dict(judge)
    return TrainConfig.model_validate(
        {
            "model": {"name": job["model"]},
            "env": {"id": ENV_ID, "kwargs": {k: v for k, v in paths.items() if v is not None}},
            "grader": {"spec": spec},
            "sampling": {
                "max_new_tokens": _EFFORT_TOKENS[hyper["reasoning_effort"]],
                "temperature": 1.0,
            },
            "rollout": {
                "prompts_per_step": hyper["batch_size"],
                "dynamic_sampling": False,
                "group_size": max(2, round(4 * hyper["compute_multiplier"])),
            },
            "optim": {"lr": BASE_LR * hyper["learning_rate_multiplier"]},
            "eval": {
                "tasks": hyper["eval_samples"] if validation else 0,
                "every": hyper["eval_interval"] if validation else 0,
            },
            "run": {
                "steps": hyper["steps"],
                "seed": job["seed"],
                "output_dir": str(jobs_dir),
                "name": job["id"],
                "checkpoint_every": hyper["eval_interval"],
                "report_to": [],
                **({"threads": threads} if threads else {}),
                **({"cluster": "ray", "ray_address": ray_address} if ray_address else {}),
            },
        }
    )


def resolve_supervised(asked: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """Supervised hyperparameters as values, `"auto"` resolved (module docstring)."""
    batch = int(asked.get("batch_size") or min(16, rows))
    epochs = int(asked.get("n_epochs") or 3)
    return {
        "batch_size": batch,
        "n_epochs": epochs,
        "learning_rate_multiplier": float(asked.get("learning_rate_multiplier") or 1.0),
        "steps": epochs * math.ceil(rows / batch),
    }


def sft_config(
    job: Mapping[str, Any],
    hyper: Mapping[str, Any],
    train_path: str,
    jobs_dir: Path,
    threads: int | None,
) -> TrainConfig:
    """The rldojo config a supervised job trains with (`run_sft` on `train_path`)."""
    return TrainConfig.model_validate(
        {
            "model": {"name": job["model"]},
            "sft": {"data": train_path, "batch_size": hyper["batch_size"], "only_passed": False},
            "optim": {"lr": SFT_BASE_LR * hyper["learning_rate_multiplier"]},
            "eval": {"tasks": 0, "before": False},
            "run": {
                "epochs": hyper["n_epochs"],
                "seed": job["seed"],
                "output_dir": str(jobs_dir),
                "name": job["id"],
                "report_to": [],
                **({"threads": threads} if threads else {}),
            },
        }
    )
