"""CLI commands contributed by subsystems, each in its own module.

A module here defines `register(app: typer.Typer) -> None` and adds its commands to the
`rldojo` app. `rldojo.cli` calls `register` of every module named in `COMMAND_MODULES`,
so a subsystem adds a command without editing `cli.py`.
"""

COMMAND_MODULES = (
    "rldojo.commands.train",
    "rldojo.commands.doctor",
    "rldojo.commands.serve",
    "rldojo.commands.grade",
    "rldojo.commands.check_env",
    "rldojo.commands.curate",
    "rldojo.commands.evaluation",
    "rldojo.commands.entropy",
    "rldojo.commands.distill",
    "rldojo.commands.ledger",
    "rldojo.commands.new_env",
    "rldojo.commands.dashboard",
    "rldojo.commands.export",
    "rldojo.commands.service",
    "rldojo.commands.sft",
    "rldojo.commands.demos",
    "rldojo.commands.pipeline",
    "rldojo.commands.config_doc",
    "rldojo.commands.plugins",
    "rldojo.commands.env_serve",
)
