"""The `rldojo` command line: the typer app and its entry point; `envs` here, every other
command in its own module under `rldojo.commands` (train, doctor, eval, ...).

Every command turns bad input into a one-line error and exit code 2 (config errors name
the file and key; data errors name the file, line and field), never a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

from rldojo.commands.ui import console

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False
)
_debug = {"on": os.environ.get("RLDOJO_DEBUG", "") == "1"}


@app.callback()
def _options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an unexpected error")
    ] = False,
) -> None:
    """rldojo: reinforcement learning of language models on verifiable environments."""
    _debug["on"] = _debug["on"] or debug


def main() -> None:
    """The `rldojo` entry point: an unexpected error is one line (and exit code 1), its
    traceback only with `--debug` (or `RLDOJO_DEBUG=1`)."""
    try:
        app()
    except Exception as exc:
        if _debug["on"]:
            raise
        text = " ".join(str(exc).split())[:500]
        console.print(
            f"[red]error:[/] {type(exc).__name__}: {escape(text)} (rldojo --debug ... shows "
            "the traceback)",
            soft_wrap=True,
        )
        sys.exit(1)


@app.command()
def envs() -> None:
    """List the registered environments."""
    from rldojo.envs.registry import list_envs

    for env_id in list_envs():
        console.print(env_id)


def _register_subsystem_commands() -> None:
    import importlib

    from rldojo.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_subsystem_commands()

if __name__ == "__main__":
    main()
