"""`rldojo plugins` and `rldojo envs`: what is installed, where it came from, what it takes.

    rldojo plugins [--json]      # environments, grader types, experts and their origins
    rldojo envs                  # the environment ids
    rldojo envs --kwargs crm-v1  # an environment's kwargs: name, type, default, doc

Origins (`rldojo.plugins.Origin`): ``builtin`` (a module of rldojo), ``module`` (code that
called `register`), ``entry point`` (an installed distribution, with its version).
Plugins of installed packages are listed without being imported; one that failed to load
is listed under "failed to load" with the reason.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    """Add `rldojo plugins` and `rldojo envs` to the app."""
    app.command("plugins")(plugins)
    app.command("envs")(envs)


def _registries() -> dict[str, Any]:
    from rldojo.envs.experts import EXPERTS
    from rldojo.envs.registry import ENVS
    from rldojo.graders.specs.context import GRADERS

    return {"envs": ENVS, "graders": GRADERS, "experts": EXPERTS}


def plugin_report() -> dict[str, Any]:
    """What `rldojo plugins --json` prints: per kind, each plugin's name and origin, and
    what failed to load (`errors`)."""
    report: dict[str, Any] = {}
    errors: dict[str, dict[str, str]] = {}
    for kind, registry in _registries().items():
        report[kind] = [{"name": p.name, **p.origin.as_dict()} for p in registry.entries()]
        errors[kind] = dict(registry.errors)
    report["errors"] = errors
    return report


def plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines")] = False,
) -> None:
    """List the installed environments, grader types and experts, and where each came from."""
    from rich.table import Table

    from rldojo.commands.ui import console

    report = plugin_report()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    table = Table(title="rldojo plugins")
    for column in ("kind", "name", "origin"):
        table.add_column(column, no_wrap=True)
    table.add_column("from", overflow="fold")
    for kind in ("envs", "graders", "experts"):
        for row in report[kind]:
            source = row["target"]
            if row["origin"] == "entry point":
                source = f"{row['distribution']} {row['version']} ({row['target']})"
            table.add_row(kind.rstrip("s"), row["name"], row["origin"], source)
    console.print(table)
    for kind, failed in report["errors"].items():
        for what, why in failed.items():
            console.print(f"[red]failed to load[/] ({kind}) {what}: {why}", soft_wrap=True)


def envs(
    kwargs: Annotated[
        str | None,
        typer.Option("--kwargs", metavar="ID", help="List this environment's kwargs"),
    ] = None,
    reasoning_gym: Annotated[
        bool,
        typer.Option(
            "--reasoning-gym", help="List reasoning-gym's datasets (reasoning-gym-v1 dataset=)"
        ),
    ] = False,
) -> None:
    """List the registered environments, one environment's kwargs, or the datasets of
    reasoning-gym-v1 (from the installed reasoning-gym's registry)."""
    from rldojo.commands.ui import console

    if kwargs is not None:
        _print_kwargs(kwargs)
        return
    if reasoning_gym:
        _print_reasoning_gym()
        return
    from rldojo.envs.registry import list_envs

    for env_id in list_envs():
        console.print(env_id)


def _print_reasoning_gym() -> None:
    """One dataset name a line; a one-line error when the extra is not installed."""
    from rldojo.commands.ui import console, fail
    from rldojo.envs.reasoning_gym.env import OptionalDependencyError, dataset_names

    try:
        names = dataset_names()
    except OptionalDependencyError as exc:
        fail(str(exc))
        return
    for name in names:
        console.print(name, highlight=False)


def _print_kwargs(env_id: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    from rldojo.commands.ui import console, fail
    from rldojo.envs.kwargs import kwargs_rows
    from rldojo.envs.registry import UnknownEnvError, resolve_factory

    try:
        factory = resolve_factory(env_id)
    except UnknownEnvError as exc:
        fail(str(exc))
        return
    rows, from_model = kwargs_rows(factory)
    table = Table(title=f"{escape(env_id)} kwargs")
    table.add_column("name", no_wrap=True)
    for column in ("type", "default", "doc"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(x) for x in (row.name, row.type, row.default, row.doc)))
    console.print(table)
    if not from_model:
        console.print(f"{escape(env_id)} declares no Kwargs model: read from its signature")
