"""`rldojo new-env NAME`: scaffold a package with your own environment and grader.

    rldojo new-env my_env            # single-turn: one prompt, one answer
    rldojo new-env my_env --tools    # multi-turn: tool calls, then an answer
    rldojo new-env my_env --dir src  # in src/my_env instead of ./my_env

writes DIR/NAME with pyproject.toml (registers the id ``NAME-v1`` in the ``rldojo.envs``
entry-point group), the package NAME (env.py, grader.py), tests/test_env.py and a
train.toml for `rldojo train`. The generated environment passes `rldojo check-env` and
its tests as written, so a newcomer starts from something that works and edits it.

NAME must be a lowercase Python identifier that is not already an importable module
(environment ids are lowercase, and the package is imported by that name). An existing
DIR/NAME is never overwritten. Bad input exits 2 with a one-line error.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
from pathlib import Path
from string import Template
from typing import Annotated

import typer

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")


def register(app: typer.Typer) -> None:
    app.command("new-env")(new_env_command)


def camel_case(name: str) -> str:
    """``my_env`` -> ``My``, ``shop`` -> ``Shop``: the prefix of the generated class names
    (``MyEnv``, ``MyGrader``); a trailing ``env`` is dropped so that no ``EnvEnv`` appears."""
    camel = "".join(part.capitalize() for part in name.split("_"))
    if camel.endswith("Env") and len(camel) > 3:
        camel = camel[:-3]
    return camel


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a new environment package (None when it can)."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return f"NAME {name!r} is not a valid Python identifier; use e.g. my_env"
    if not NAME_PATTERN.match(name):
        return (
            f"NAME {name!r} must be lowercase (a-z, 0-9, _; starting with a letter), "
            f"since environment ids are lowercase; use e.g. {name.lower().lstrip('_') or 'my_env'}"
        )
    return None


def is_importable(name: str) -> bool:
    """Whether ``import name`` already finds something (then the package would be shadowed
    or would shadow it, and ``name.env:...`` paths would import the wrong module)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True


def render_files(name: str, *, tools: bool) -> dict[str, str]:
    """The scaffold's files, relative path -> text (nothing is written)."""
    from rldojo.commands.templates import common, single_turn, tool_env

    kind = tool_env if tools else single_turn
    values = {"name": name, "camel": camel_case(name), "description": kind.DESCRIPTION}
    templates = {
        "pyproject.toml": common.PYPROJECT,
        f"{name}/__init__.py": common.INIT,
        f"{name}/env.py": kind.ENV,
        f"{name}/grader.py": kind.GRADER,
        "tests/test_env.py": kind.TEST,
        "train.toml": kind.TRAIN,
    }
    return {path: Template(text).substitute(values) for path, text in templates.items()}


FILE_ROLES = {
    "pyproject.toml": "package metadata; registers the id {id} (entry point rldojo.envs)",
    "__init__.py": "the package",
    "env.py": "the environment: tasks and episodes",
    "grader.py": "the grader: a finished episode -> Score",
    "test_env.py": "pytest: check_env passes, the grader scores right and wrong answers",
    "train.toml": "rldojo train config (tiny-random; switch to smollm2-135m-instruct)",
}


def new_env_command(
    name: Annotated[str, typer.Argument(help="Package name, a lowercase Python identifier")],
    tools: Annotated[
        bool, typer.Option("--tools", help="A multi-turn tool-using environment")
    ] = False,
    directory: Annotated[
        Path, typer.Option("--dir", help="Where to create the NAME directory")
    ] = Path("."),
) -> None:
    """Scaffold a package with an environment, a grader, tests and a train config."""
    from rich.markup import escape

    from rldojo.commands.ui import console, fail

    problem = name_problem(name)
    if problem is not None:
        fail(problem)
    target = directory / name
    if target.exists():
        fail(f"{target} already exists; pick another NAME or --dir (nothing was written)")
    if is_importable(name):
        fail(f"NAME {name!r} is already an importable module here; pick another name")
    if directory.exists() and not directory.is_dir():
        fail(f"--dir {directory} is not a directory")
    files = render_files(name, tools=tools)
    try:
        for rel, text in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}")
    camel, env_id = camel_case(name), f"{name}-v1"
    kind = "multi-turn tool" if tools else "single-turn"
    console.print(f"created {escape(str(target))}/ ({kind} environment {env_id})", emoji=False)
    width = max(len(rel) for rel in files)
    for rel in files:
        role = FILE_ROLES[Path(rel).name].format(id=env_id)
        console.print(f"  {escape(rel):<{width}}  {escape(role)}", soft_wrap=True, emoji=False)
    console.print("next:")
    for line in (
        f"cd {target}",
        f"rldojo check-env {name}.env:{camel}Env --show",
        "python -m pytest tests",
        "rldojo train train.toml",
        f"pip install -e .    # then the id {env_id} works from any directory",
    ):
        console.print(f"  {escape(line)}", soft_wrap=True, highlight=False, emoji=False)
