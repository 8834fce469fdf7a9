"""What every command shares: the console, one-line failures, the user-error types.

A user error (bad config, data, env id or kwargs, model, template) is printed as one
line by `fail` with exit code 2; anything else reaches `rldojo.cli.main`, which prints
it as one line too (the traceback only with `--debug`).
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from rldojo.config import ConfigError

__all__ = ["console", "fail", "user_errors"]

console = Console()


def fail(message: str, code: int = 2) -> None:
    """One error line, then exit `code` (2: bad input; see `rldojo.train.stops`)."""
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def user_errors() -> tuple[type[Exception], ...]:
    from rldojo.data.loading import DataError
    from rldojo.envs.registry import EnvKwargsError, UnknownEnvError
    from rldojo.graders.openai_templates import TemplateError
    from rldojo.policy.models import ModelLoadError

    return (ConfigError, DataError, UnknownEnvError, EnvKwargsError, ModelLoadError, TemplateError)
