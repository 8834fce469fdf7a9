"""The layer rule of docs/architecture.md, read from the source: a package imports only
from lower layers (or itself), so there is no cycle between packages; modules and
functions stay under their size limits; the strictly typed modules take every seam by
its protocol, never `Any`; docs cite nothing outside the repository."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "rldojo"
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

LAYERS = {
    "types": 0, "config": 0, "cache": 0, "pyast": 0, "plugins": 0, "asgi": 0,
    "hardware": 1, "store": 1, "sandbox": 1, "workers": 1,
    "policy": 2, "data": 2,
    "inference": 3,
    "graders": 4,
    "envs": 5,
    "rollout": 6,
    "eval": 7, "cluster": 7, "report": 7, "dashboard": 7, "interop": 7,
    "training": 8,
    "service": 9, "api": 9,
    "commands": 10,
    "cli": 11, "rldojo": 11, "__main__": 12,
}  # fmt: skip
"""Layer of each top-level package or module of `rldojo` (the table in the doc)."""

MAX_LINES = 400


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "rldojo":
        return None
    return parts[1] if len(parts) > 1 else "rldojo"


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> list[str]:
    """Every module imported anywhere in the file (functions included), except under
    `if TYPE_CHECKING:` (annotations only; nothing runs)."""
    found: list[str] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "rldojo":
                found += [f"rldojo.{a.name}" for a in node.names]
            else:
                found.append(node.module)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _files() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        out.append((".".join(parts), path))
    return out


def test_every_package_has_a_layer():
    packages = {_package(m) for m, _ in _files()}
    assert packages - set(LAYERS) == set(), "add new packages to LAYERS and the doc"
    for name in LAYERS:
        if name != "rldojo":
            assert f"`{name}`" in DOC.read_text(), f"docs/architecture.md omits {name}"


@pytest.mark.slow
def test_imports_point_down_the_layers():
    upward = []
    for module, path in _files():
        here = _package(module)
        assert here is not None
        for target in _imports(ast.parse(path.read_text())):
            there = _package(target)
            if there is None or there == here:
                continue
            if LAYERS[there] >= LAYERS[here] and here != "rldojo":
                upward.append(f"{module} imports {target} (layer {LAYERS[there]} from "
                              f"{LAYERS[here]})")  # fmt: skip
    assert upward == []


def test_modules_stay_under_the_size_limit():
    big = {m: n for m, p in _files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


SEAM_NAMES = re.compile(r"(^|_)(policy|grader|make_env|env_factory|generation|source|sink)s?$")
"""Parameters that take a seam: each has its protocol (`Policy`, `EnvFactory`/`Env`,
`Grader`, `Generation`, `RolloutSource`, `Sink`), never `Any`."""

MAX_FUNCTION_LINES = 60
"""From `def` to the last line, docstring and decorators' arguments included."""

LONG_FUNCTIONS = {
    "rldojo.service.api_jobs:jobs_router": 162,  # the routes are closures over the state
    "rldojo.service.api_models:models_router": 116,
    "rldojo.commands.service:service": 108,  # typer options, one per line
    "rldojo.dashboard.app:api_router": 100,
    "rldojo.commands.evaluation:eval_": 78,
    "rldojo.commands.distill:distill": 80,
    "rldojo.commands.check_env:play_episode": 71,
    "rldojo.rollout.demos:collect_demos": 69,
    "rldojo.commands.demos:demos": 63,
    "rldojo.commands.grade:eval_judge": 62,
    "rldojo.sandbox.runner:_execute": 61,
    "rldojo.policy.transformers_backend:__init__": 61,
}
"""The functions over the limit today, each at most as long as it is: split one and take
it off; none may grow, and no other may pass the limit."""


def _strict_modules() -> list[str]:
    """The modules under strict mypy: the seams and the modules fully typed around them."""
    config = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())
    overrides = config["tool"]["mypy"].get("overrides", [])
    return [m for o in overrides if o.get("disallow_untyped_defs") for m in o["module"]]


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _says_any(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        (isinstance(n, ast.Name) and n.id == "Any")
        or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(annotation)
    )


def test_seams_are_typed_by_their_protocols():
    paths = dict(_files())
    strict = _strict_modules()
    assert {"rldojo.policy.base", "rldojo.training.heldout"} <= set(strict)
    loose = []
    for module in strict:
        for fn in _functions(ast.parse(paths[module].read_text())):
            a = fn.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if SEAM_NAMES.search(arg.arg) and _says_any(arg.annotation):
                    loose.append(f"{module}:{arg.lineno} {fn.name}({arg.arg})")
    assert loose == []


@pytest.mark.slow
def test_functions_stay_under_the_length_limit():
    long: dict[str, int] = {}
    for module, path in _files():
        for fn in _functions(ast.parse(path.read_text())):
            n = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            key = f"{module}:{fn.name}"
            if n > LONG_FUNCTIONS.get(key, MAX_FUNCTION_LINES):
                long[f"{key} (line {fn.lineno})"] = n
    assert long == {}


def test_nothing_cites_a_file_outside_the_repository():
    cited = []
    for module, path in _files():
        if re.search(r"DESIGN\.md|shared/", path.read_text()):
            cited.append(module)
    assert cited == []
