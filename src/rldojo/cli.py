"""The `rldojo` command line: the typer app and its entry point; every command lives in
its own module under `rldojo.commands` (train, doctor, eval, plugins, ...).

Every command turns bad input into a one-line error on stderr and exit code 2 (config
errors name the file and key; data errors name the file, line and field), never a
traceback; `main` gives every other error one line too (exit codes: 2 bad input or usage,
1 the work failed, 130 interrupted: a line without `error:`, since the user asked for it).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from rldojo.commands.ui import DEBUG, err_console, say_stop, user_errors
from rldojo.training.stops import EXIT_FAILED, EXIT_USAGE, RunStopped

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False
)


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Show the traceback of an unexpected error or failed grade"),
    ] = False,
) -> None:
    """rldojo: reinforcement learning of language models on verifiable environments."""
    DEBUG["on"] = DEBUG["on"] or debug


def main() -> None:
    """The `rldojo` entry point. Every error is one line on stderr with a documented exit
    code (`rldojo.training.stops`): 2 bad input or usage (typer's usage errors too), 1 the
    work failed, 130 interrupted. A `RunStopped` exits with its own code (an interrupt's
    line is no `error:`; `say_stop`) and a user error (`user_errors`) with 2, whichever
    command raised it; any other error exits 1, its traceback only with `--debug` (or
    `RLDOJO_DEBUG=1`), which also shows the traceback a stop's failed grades kept."""
    try:
        app()
    except RunStopped as exc:
        say_stop(exc)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if isinstance(exc, user_errors()):
            _error_line(str(exc))
            sys.exit(EXIT_USAGE)
        if DEBUG["on"]:
            raise
        _error_line(
            f"{type(exc).__name__}: {_one_line(str(exc))} (rldojo --debug ... shows the traceback)"
        )
        sys.exit(EXIT_FAILED)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]  # a message with a whole file in it stays readable


def _error_line(text: str) -> None:
    err_console.print(f"[red]error:[/] {escape(' '.join(text.split()))}", soft_wrap=True)


def _register_subsystem_commands() -> None:
    import importlib

    from rldojo.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_subsystem_commands()

if __name__ == "__main__":
    main()
