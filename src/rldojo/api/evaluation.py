"""`evaluate` from Python: a model (or a run directory's newest checkpoint) on tasks.

What is evaluated is resolved the way `rldojo eval --model RUN_DIR` resolves it, from the
same `rldojo.eval.run_settings`: a run directory (one with `config.toml`) stands for its
newest checkpoint, and its config gives what the call leaves out (`env.id` and
`env.kwargs`, its `eval.tasks` held-out tasks, the token and turn limits of its held-out
evaluation, the grader spec and pass threshold, `run.seed`), so

    rldojo.evaluate("runs/quickstart").accuracy

scores the run's last weights as its own "after" evaluation did. A run on a reward
function evaluates in the process that trained it, or anywhere with its rows and function
(`tasks=ROWS, reward=FUNCTION`). The episodes run through
`rldojo.eval.harness.evaluate`, one greedy sample per task unless `temperature` > 0.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rldojo.api.runs import quiet_progress_bars
from rldojo.config import TrainConfig
from rldojo.envs.base import Env
from rldojo.envs.function_reward import (
    FunctionGrader,
    FunctionRewardEnv,
    RewardFunction,
    rows_to_tasks,
)
from rldojo.eval.run_settings import (
    FUNCTION_ENV_PREFIX,
    RunEvalSettings,
    is_run_dir,
    run_eval_settings,
)
from rldojo.graders.base import Grader
from rldojo.types import SamplingParams, Task

if TYPE_CHECKING:
    from rldojo.eval.harness import EvalResult
    from rldojo.policy.base import Policy

__all__ = ["evaluate"]


def evaluate(
    model_or_run_dir: str | os.PathLike[str] | Policy,
    env: str | Env | Callable[[], Env] | None = None,
    *,
    tasks: Tasks | None = None,
    n: int | None = None,
    split: str = "test",
    max_new_tokens: int | None = None,
    max_turns: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    grader: Grader | None = None,
    reward: RewardFunction | None = None,
    temperature: float = 0.0,
    pass_threshold: float | None = None,
    device: str = "auto",
    seed: int | None = None,
) -> EvalResult:
    """One sample per task, greedy by default, graded: accuracy, Wilson interval, mean
    reward, statuses and a row per task (`rldojo.eval.harness.EvalResult`).

    `model_or_run_dir`: a model name, a model or checkpoint directory, a run directory
    (see the module docstring), or a `Policy` (`rldojo.policy.adapters`). `env`: an id, a
    `module:factory`, a factory, or an `Env` (copied for each episode); None: the run's.
    `tasks`: `Task`s, or rows as `rldojo.train` takes them (graded by `reward`); None:
    the first `n` tasks of the env's `split`. `grader` (a `Grader`) or `reward` (a
    function, as `rldojo.train` takes it) replaces the env's own grader."""
    from rldojo.eval.harness import evaluate as harness_evaluate

    spec, run = _model_and_run(model_or_run_dir)
    target = _target(env, env_kwargs, tasks, grader, reward, run)
    seed = seed if seed is not None else run.seed if run is not None else 0
    if n is None and target.is_runs and run is not None:
        n = run.tasks  # the run's own held-out tasks
    if run is not None:
        spec = str(run.checkpoint())
    task_list = (
        list(target.tasks)
        if target.tasks is not None
        else list(target.make().tasks(split, seed=seed, n=n))
    )
    task_list = task_list[:n] if n is not None else task_list
    if not task_list:
        raise ValueError(f"evaluate: no tasks ({target.name}, split {split!r})")
    max_new, episode, grade_timeout_s = _limits(run, max_new_tokens, max_turns)
    sampling = SamplingParams(max_new, temperature, seed=seed)
    threshold = _threshold(pass_threshold, run, target)

    def run_it() -> EvalResult:
        coro = harness_evaluate(
            target.make,
            target.grader,
            policy,
            task_list,
            sampling,
            seed=seed,
            grade_timeout_s=grade_timeout_s,
            pass_threshold=threshold,
            episode=episode,
        )
        return asyncio.run(coro)

    with quiet_progress_bars():
        policy = _policy(spec, device)
        return _outside_running_loop(run_it)


def _outside_running_loop(fn: Callable[[], EvalResult]) -> EvalResult:
    """`fn()`, in a thread of its own when this thread runs an event loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


def _model_and_run(
    spec: str | os.PathLike[str] | Policy,
) -> tuple[str | Policy, RunEvalSettings | None]:
    """The model spec and, for a run directory, the run's held-out evaluation (the spec is
    then replaced by its newest checkpoint, once the env is known to be there)."""
    if not isinstance(spec, str | os.PathLike):
        return spec, None  # a Policy
    if not is_run_dir(os.fspath(spec)):
        return os.fspath(spec), None
    return os.fspath(spec), run_eval_settings(os.fspath(spec))


@dataclass
class _Target:
    """What the episodes run in and how they are graded."""

    name: str
    make: Callable[[], Env]
    grader: Grader
    tasks: list[Task] | None = None
    threshold: float = 1.0
    is_runs: bool = False  # the run's own environment: its tasks, grader and threshold


EnvSpec = str | Env | Callable[[], Env] | None
"""What `evaluate` takes as `env`: an id or `module:factory`, an instance, a factory."""

Tasks = Sequence[Task] | Sequence[Mapping[str, Any]]
"""What `evaluate` takes as `tasks`: `Task`s, or rows as `rldojo.train` takes them."""


def _target(
    env: EnvSpec,
    env_kwargs: Mapping[str, Any] | None,
    tasks: Tasks | None,
    grader: Grader | None,
    reward: RewardFunction | None,
    run: RunEvalSettings | None,
) -> _Target:
    if grader is not None and reward is not None:
        raise ValueError("evaluate: pass grader= or reward=, not both")
    replacing = FunctionGrader(reward) if reward is not None else grader
    given = None if tasks is None else list(tasks)
    if given and all(isinstance(t, Mapping) for t in given):
        if replacing is None or env is not None:
            raise ValueError(
                "evaluate: tasks given as rows are graded by reward= (a function) "
                "or grader=, in no env="
            )
        rows = rows_to_tasks(
            [t for t in given if isinstance(t, Mapping)], source="tasks", split="test"
        )
        posed = FunctionRewardEnv(_unused, (), rows, env_id="rows-v1")  # graded by `replacing`
        return _Target("rows", lambda: copy.copy(posed), replacing, rows)
    target = _env_target(env, env_kwargs, run)
    if given is not None:
        target.tasks = [t for t in given if isinstance(t, Task)]
        if len(target.tasks) < len(given):
            raise ValueError("evaluate: tasks are Tasks or rows (mappings), not both")
    if replacing is not None:
        target.grader, target.threshold = replacing, 1.0
    return target


def _unused(prompt: object, completion: str) -> float:
    """The rows' env's own reward: never called, `grader=` or `reward=` grades them."""
    raise RuntimeError("evaluate: rows are graded by grader= or reward=")


def _env_target(
    env: EnvSpec, env_kwargs: Mapping[str, Any] | None, run: RunEvalSettings | None
) -> _Target:
    from rldojo.envs.registry import make_env

    kwargs = dict(env_kwargs or {})
    if env is None:
        if run is None:
            raise ValueError("evaluate: env= is needed unless the model is a run directory")
        if run.env is None:
            raise ValueError(
                "evaluate: the run trained on several environments (env.mix); pick one with env="
            )
        env = run.env
    if isinstance(env, str):
        runs_env = run if run is not None and env == run.env else None
        if runs_env is not None and env_kwargs is None:
            kwargs = dict(runs_env.env_kwargs)
        if env.startswith(FUNCTION_ENV_PREFIX):
            _check_registered(env, runs_env)

        def make() -> Env:
            return make_env(env, **kwargs)

        target = _Target(env, make, make().default_grader(), is_runs=runs_env is not None)
        return _grader_of_run(target, run)
    if isinstance(env, Env):
        instance = env
        name = getattr(env, "env_id", type(env).__name__)
        return _Target(name, lambda: copy.deepcopy(instance), env.default_grader())
    if callable(env):
        factory = env

        def build() -> Env:
            return factory(**kwargs)

        return _Target(getattr(env, "__name__", "env"), build, build().default_grader())
    raise TypeError(f"evaluate: env: expected an id, a factory or an Env, got {type(env).__name__}")


def _check_registered(env_id: str, run: RunEvalSettings | None) -> None:
    """A reward function's env exists only in the process that registered it."""
    from rldojo.envs.registry import list_envs

    if env_id in list_envs():
        return
    if run is not None:
        raise ValueError(run.function_env_error())
    raise ValueError(
        f"evaluate: {env_id} is a reward function's environment, registered "
        "only in the process that trained on it; pass its rows and function: "
        "tasks=ROWS, reward=FUNCTION"
    )


def _grader_of_run(target: _Target, run: RunEvalSettings | None) -> _Target:
    """The run's grader spec (and its pass threshold), when the env is the run's."""
    if run is None or not target.is_runs:
        return target
    grader = run.grader()
    if grader is not None:
        target.grader = grader
        target.threshold = float(getattr(grader, "pass_threshold", 1.0))
    return target


def _threshold(given: float | None, run: RunEvalSettings | None, target: _Target) -> float:
    """What passes: the threshold given, else the run's `grader.pass_threshold`, else the
    grader spec's (the run's spec), else 1.0."""
    if given is not None:
        return given
    if run is not None and run.config.grader.pass_threshold is not None:
        return run.config.grader.pass_threshold
    return target.threshold


def _limits(
    run: RunEvalSettings | None, max_new_tokens: int | None, max_turns: int | None
) -> tuple[int, dict[str, Any], float]:
    """Tokens per turn, the episode limits and the grading timeout: those given, else the
    run's held-out evaluation's, else the config's defaults."""
    if run is None:
        cfg = TrainConfig()
        ro = cfg.rollout
        episode = {
            "max_turns": ro.max_turns,
            "env_timeout_s": ro.env_timeout_s,
            "max_episode_tokens": ro.max_episode_tokens,
        }
        default_new, grade_timeout_s = cfg.sampling.max_new_tokens, ro.grade_timeout_s
    else:
        episode, default_new = dict(run.episode), run.max_new_tokens
        grade_timeout_s = run.grade_timeout_s
    episode["max_turns"] = max_turns or episode["max_turns"]
    return max_new_tokens or default_new, episode, grade_timeout_s


def _policy(spec: str | Policy, device: str) -> Policy:
    """A local model as a `TransformersPolicy` (a LoRA adapter directory merged into its
    base), on `device`; a `Policy` as it is."""
    if not isinstance(spec, str):
        return spec
    from rldojo.config import GenerationConfig
    from rldojo.policy.device import resolve_device
    from rldojo.policy.lora import is_adapter_dir, load_merged
    from rldojo.policy.models import check_model, load_model
    from rldojo.policy.transformers_backend import TransformersPolicy

    path = Path(spec).expanduser()
    if is_adapter_dir(path):
        model, tokenizer = load_merged(path)
    else:
        check_model(spec)
        model, tokenizer = load_model(spec)
    model = model.to(resolve_device(device))
    cache_mb = GenerationConfig().prefix_cache_mb  # multi-turn episodes: reuse the last turn
    return TransformersPolicy(model, tokenizer, prefix_cache_mb=cache_mb)
