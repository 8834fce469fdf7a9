"""`ServiceSettings`: what the operator of `rldojo service` decides (one field each).

The CLI (`rldojo.commands.service`) fills it from its options; tests build it directly.
API keys come from `RLDOJO_API_KEYS` (comma-separated) and/or `--api-keys-file` (one key
per line, `#` comments); a key is never stored, only its SHA-256 (the owner of what the
key creates). The judge endpoint's key (`judge_api_key`) is never stored either.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import Request

__all__ = ["ServiceSettings", "load_api_keys", "owner_of"]

BUILTIN_BASE_MODELS = ("tiny-random", "smollm2-135m-instruct")


@dataclass(frozen=True)
class ServiceSettings:
    data_dir: Path
    """Where state lives: `service.sqlite`, `files/` (uploads), `jobs/<id>/` (run dirs)."""
    api_keys: frozenset[str] = frozenset()
    """Valid API keys; a request without one of them gets 401. Empty: every request 401."""
    max_concurrent_jobs: int = 1
    """Jobs training at once, each in its own worker process; the rest wait `queued`."""
    max_file_bytes: int = 64 * 1024 * 1024
    """Largest accepted upload; a bigger one is a 413 before it is stored."""
    base_models: tuple[str, ...] = BUILTIN_BASE_MODELS
    """Models a job may fine-tune (and chat may serve): built-in names plus any local
    model directories the operator allows (`--allow-model PATH`)."""
    max_loaded_models: int = 2
    """Models kept loaded for /v1/chat/completions and /v1/completions (least recently
    used is closed first)."""
    job_threads: int | None = None
    """torch threads of each job's trainer (None: rldojo's default for the machine)."""
    worker_start_timeout_s: float = 120.0
    """How long a job's worker process may take to start."""
    poll_s: float = 0.25
    """How often the scheduler looks at queued jobs and running jobs' run directories."""
    ray_address: str | None = None
    """A Ray cluster (`host:port`, `ray://host:10001`, `auto`) for reinforcement jobs'
    rollout workers (`run.cluster = "ray"`, `run.ray_address`); None: in the job's worker.
    Supervised jobs ignore it (SFT has no rollouts)."""
    judge_base_url: str | None = None
    """An OpenAI-compatible endpoint answering model graders (`score_model`, `label_model`,
    `rubric`, `group_judge`) for the model each spec names (`rldojo.service.judge`);
    None: such graders are a 400."""
    judge_api_key: str | None = field(default=None, repr=False)
    """The judge endpoint's API key (`--judge-api-key`, `RLDOJO_JUDGE_API_KEY`); never
    written to a job, event, config or log."""
    keep_checkpoints: int = 2
    """Checkpoints kept per job: the newest K (at least 1: the newest is the one a paused
    or restarted job resumes from, and the final model once the job succeeded). Older
    ones are deleted, with their `checkpoints` entries, as newer ones are written."""
    pause_timeout_s: float = 120.0
    """How long a paused job's worker may take to stop at its next safe point (after the
    step in flight, with a checkpoint of that step) before it is killed; a killed job
    resumes from its newest earlier checkpoint."""
    preflight_rows: int = 3
    """Training rows graded at job creation with the job's grader, each with the row's
    reference answer (or a fixed sample) as the output: when every one errors, the job
    is a 400 naming the grader's error (0: no preflight)."""
    signal_prompts: int = 4
    """Prompts of the learning-signal check a reinforcement job runs before step 1 (the
    base model's samples, graded: pass rate, groups with reward variance); 0: no check."""
    signal_samples: int = 4
    """Samples per prompt of the learning-signal check."""
    signal_max_tokens: int = 16
    """New tokens per sample of the learning-signal check (kept small: it is a probe)."""
    signal_timeout_s: float = 120.0
    """The learning-signal check's time limit, model loading included; past it the check
    is skipped (an event says so) and training starts in a fresh worker."""


def owner_of(key: str) -> str:
    """The owner id of an API key (its SHA-256, shortened): stored instead of the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


Owner = Callable[["Request"], str]
"""The routes' auth dependency: the owner id of a request's API key (a 401 without one)."""


def load_api_keys(keys_file: Path | None = None, env: str | None = None) -> frozenset[str]:
    """Keys from `RLDOJO_API_KEYS` (or `env`) and the keys file; ValueError if unreadable."""
    text = os.environ.get("RLDOJO_API_KEYS", "") if env is None else env
    keys = {k.strip() for k in text.split(",") if k.strip()}
    if keys_file is not None:
        try:
            lines = keys_file.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"{keys_file}: cannot read API keys: {exc.strerror}") from None
        keys |= {ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")}
    return frozenset(keys)
