"""`rldojo config`: the config a run would use, or the reference of every key.

`rldojo config [CONFIG] [--set k=v ...]` prints the resolved config as TOML (every key,
defaults filled in), the same text a run writes into its run directory;
`rldojo config --markdown` prints the configuration reference generated from the config
models (`rldojo.config.reference`), committed as docs/config.md. `--out PATH` writes
either to a file instead of stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rldojo.commands.ui import console, fail


def register(app: typer.Typer) -> None:
    app.command("config")(config)


def config(
    path: Annotated[
        Path | None,
        typer.Argument(metavar="CONFIG", help="TOML config (default: the quickstart)"),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override, e.g. loss.rho=1.0")
    ] = None,
    markdown: Annotated[
        bool,
        typer.Option("--markdown", help="Print the reference of every key (docs/config.md)"),
    ] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Write to this file")] = None,
) -> None:
    """Print the config a run would use as TOML, or with --markdown the reference of
    every config key (`rldojo config --markdown --out docs/config.md`)."""
    from rldojo.config import dump_config, load_config
    from rldojo.config.reference import markdown as reference

    if markdown and (path is not None or overrides):
        fail("--markdown documents every key and their defaults; it takes no CONFIG or --set")
    text = reference() if markdown else dump_config(load_config(path, overrides or []))
    if out is None:
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    console.print(f"wrote {out}")
