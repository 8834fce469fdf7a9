"""What every command shares: the consoles, one-line failures, the user-error types.

Results go to `console` (stdout); errors to `err_console` (stderr), so `rldojo train >
log` still shows them. A user error (bad config, data, env id or kwargs, an env this
machine cannot run, model, template, a port in use) is printed as one line by `fail` with
exit code 2 (`EXIT_USAGE`); anything else reaches `rldojo.cli.main`, which prints it as
one line too (the traceback only with `--debug`) with the exit codes of
`rldojo.training.stops`. A run that stopped (`RunStopped`) is one line by `stop`: after
`error: ` unless it was interrupted (no error: the user asked for it), with the traceback
its failed grades kept when `--debug` is on.
"""

from __future__ import annotations

import json
import os
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from rldojo.config import ConfigError, ConfigValueError, TrainConfig
from rldojo.training.stops import EXIT_USAGE

if TYPE_CHECKING:
    from rldojo.training.stops import RunStopped

__all__ = [
    "DEBUG",
    "check_envs_early",
    "console",
    "err_console",
    "fail",
    "parse_env_kwargs",
    "say_stop",
    "stop",
    "user_errors",
]

console = Console()
err_console = Console(stderr=True)
DEBUG = {"on": os.environ.get("RLDOJO_DEBUG", "") == "1"}
"""`rldojo --debug` (or `RLDOJO_DEBUG=1`): tracebacks of unexpected errors, and the one a
stop's failed grades kept."""


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """One error line on stderr, then exit `code` (2: bad input; see `rldojo.training.stops`)."""
    err_console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def say_stop(exc: RunStopped, suffix: str = "") -> None:
    """The line of a stopped run on stderr (`error: ` first unless `exc.error` is False),
    after the traceback of its cause (a failed grade's) when `DEBUG` is on."""
    if DEBUG["on"] and exc.__cause__ is not None:
        shown = "".join(traceback.format_exception(exc.__cause__))
        err_console.print(shown, end="", markup=False, highlight=False, soft_wrap=True)
    line = escape(" ".join(f"{exc}{suffix}".split()))
    err_console.print(f"[red]error:[/] {line}" if exc.error else line, soft_wrap=True)


def stop(exc: RunStopped, suffix: str = "") -> NoReturn:
    """`say_stop`, then exit with the stop's code (1 failed, 130 interrupted)."""
    say_stop(exc, suffix)
    raise typer.Exit(exc.exit_code)


def relaunch_on_ranks(nproc: int | None) -> None:
    """`--nproc N` (N > 1): run this same command on N ranks of this machine through
    torchrun (`torchrun --nproc-per-node N -m rldojo ...`), then exit with its code. A
    rank (torchrun sets `RANK`) never relaunches."""
    if nproc is None or nproc <= 1 or "RANK" in os.environ:
        return
    import subprocess
    import sys

    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            argv.append(arg)
    # --standalone: a free rendezvous port, so two runs on one machine never collide
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "rldojo",
        *argv,
    ]
    raise typer.Exit(subprocess.call(command))


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """`--env-kwargs JSON` as a dict; a `ValueError` naming the option otherwise."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--env-kwargs is not valid JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"--env-kwargs must be a JSON object, got {type(kwargs).__name__}")
    return kwargs


def check_envs_early(config: TrainConfig) -> None:
    """Check every environment id and its kwargs of `config` (`env.id`, `env.mix`) against
    the registry, before a command imports torch and the trainer: a typo is one line in
    about a second, not after ten seconds of imports. Raises `UnknownEnvError` or
    `EnvKwargsError`; the full checks (data files, graders, the model) still run later."""
    from rldojo.envs.registry import UnknownEnvError, check_kwargs, resolve_factory

    mix = [(f"env.mix.{i}.id", e.id, e.kwargs) for i, e in enumerate(config.env.mix)]
    for key, env_id, kwargs in mix or [("env.id", config.env.id, config.env.kwargs)]:
        try:
            factory = resolve_factory(env_id)
        except UnknownEnvError as exc:  # named by its key, as a config's errors are
            raise UnknownEnvError(f"{key}: {exc}") from None
        check_kwargs(env_id, factory, dict(kwargs))


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that are the user's input: one line and exit code 2, never a
    traceback. A `ConfigError` names its config file; the others name a key, a data file,
    an env id or a port, and a command that read a config file puts its name in front."""
    from rldojo.asgi import PortInUseError
    from rldojo.data.loading import DataError
    from rldojo.envs.base import EnvUnavailableError
    from rldojo.envs.registry import EnvKwargsError, UnknownEnvError
    from rldojo.graders.openai_templates import TemplateError
    from rldojo.policy.errors import ModelLoadError

    return (
        ConfigError,
        ConfigValueError,
        DataError,
        UnknownEnvError,
        EnvKwargsError,
        EnvUnavailableError,
        ModelLoadError,
        TemplateError,
        PortInUseError,
    )
