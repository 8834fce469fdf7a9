"""The configuration reference (docs/config.md), generated from the config models.

Every TOML table is one pydantic model and every key is documented once, by the string
literal right below its field (an attribute docstring). Pydantic keeps those (as
`description`) only with `use_attribute_docstrings`, which `_Section` does not set, so
they are read from the source with `ast`, as `tests/test_config.py` checks that every
field has one. Defaults are read from the source too: the page shows what the code
declares (`os.cpu_count()`, not this machine's count), so it is the same on every machine
and a test can compare it with the committed page. `rldojo config --markdown` prints it.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel

from rldojo.config.stages import is_stage

DOC_PATH = "docs/config.md"
"""Where the generated page is committed, relative to the repository root."""

REGENERATE = "rldojo config --markdown --out docs/config.md"
"""The command that rewrites the committed page."""

_TYPE_NAMES = {str: "string", int: "integer", float: "float", bool: "boolean", dict: "table"}
_PLURALS = {"string": "strings", "integer": "integers", "float": "floats", "table": "tables"}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class KeyDoc:
    """One key of a table: its name, type (with bounds), declared default and docstring."""

    name: str
    type: str
    default: str
    doc: str


@dataclass(frozen=True)
class TableDoc:
    """One TOML table: its dotted path, whether it is an array of tables, its model and
    its keys."""

    path: str
    array: bool
    model: type[BaseModel]
    doc: str
    keys: tuple[KeyDoc, ...]

    @property
    def heading(self) -> str:
        return f"[[{self.path}]]" if self.array else f"[{self.path}]"


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field's attribute docstring (cleaned, as `inspect.cleandoc`), by field name;
    fields without one are absent."""
    docs: dict[str, str] = {}
    for name, _, doc in _declarations(model):
        if doc:
            docs[name] = doc
    return docs


def tables(root: type[BaseModel] | None = None) -> list[TableDoc]:
    """The tables of `root` (default: `TrainConfig`), whose fields are the top-level
    tables, in declaration order; a table nested in another follows its parent."""
    if root is None:
        from rldojo.config import TrainConfig

        root = TrainConfig
    docs = field_docs(root)
    out: list[TableDoc] = []
    for name, field in root.model_fields.items():
        nested = _nested_model(field.annotation)
        if nested is not None:
            _walk(nested[0], name, nested[1], docs.get(name, ""), out)
    return out


def markdown(root: type[BaseModel] | None = None) -> str:
    """The reference page: an introduction, then one section per table."""
    found = tables(root)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from the models in src/rldojo/config/: edit their field docstrings,",
        f"not this page, then run `{REGENERATE}`. -->",
        "",
        "A training config is a TOML file whose tables are the sections below (`rldojo train",
        "CONFIG`); `rldojo sft` reads the same file. Every key is optional unless marked",
        "required, and a key left out takes the default shown. `--set table.key=value`",
        "overrides a key from the command line (the value is a TOML literal), and",
        "`rldojo config CONFIG --set ...` prints the config a run would use. A default of",
        "`None` means the key is absent: TOML has no null, so leave such a key out, or",
        'write `"none"` to set a key whose type admits None but whose default is not None',
        '(`loss.tis_cap = "none"`, `--set loss.tis_cap=none`). An unknown key is an error',
        "that names the closest key.",
        "",
        textwrap.fill("Tables: " + ", ".join(f"`{t.heading}`" for t in found) + ".", 90),
    ]
    top = _top_keys(root)
    if top:
        lines += ["", "## Top-level keys", "", "Written before the first table.", ""]
        lines += [_key_markdown(key) for key in top]
    for table in found:
        lines += ["", f"## `{table.heading}`", ""]
        lines += [table.doc, ""] if table.doc else []
        lines += [_key_markdown(key) for key in table.keys]
    return "\n".join(lines) + "\n"


def _top_keys(root: type[BaseModel] | None) -> list[KeyDoc]:
    """The keys of `root` (default: `TrainConfig`) that are not tables (e.g. `recipe`)."""
    if root is None:
        from rldojo.config import TrainConfig

        root = TrainConfig
    declared = {name: (node, text) for name, node, text in _declarations(root)}
    keys = []
    for name, field in root.model_fields.items():
        if _nested_model(field.annotation) is None:
            node, text = declared.get(name, (None, ""))
            type_text = ", ".join([_type_text(field.annotation, name), *_bounds(field.metadata)])
            keys.append(KeyDoc(name, type_text, _default_text(node), text))
    return keys


def _walk(model: type[BaseModel], path: str, array: bool, doc: str, out: list[TableDoc]) -> None:
    """Append the table of `model` at `path`, then the tables nested in it."""
    declared = {name: (node, text) for name, node, text in _declarations(model)}
    keys: list[KeyDoc] = []
    children: list[tuple[type[BaseModel], str, bool, str]] = []
    for name, field in model.model_fields.items():
        node, text = declared.get(name, (None, ""))
        nested = _nested_model(field.annotation)
        if is_stage(model, name):  # the keys of a shared table, documented there
            keys.append(KeyDoc(name, f"table `[{path}.{name}]` of `[{name}]`'s keys", "None", text))
            continue
        if nested is not None:
            children.append((nested[0], f"{path}.{name}", nested[1], _nested_doc(path, name)))
        type_text = _type_text(field.annotation, f"{path}.{name}")
        bounds = _bounds(field.metadata)
        keys.append(KeyDoc(name, ", ".join([type_text, *bounds]), _default_text(node), text))
    out.append(TableDoc(path, array, model, doc, tuple(keys)))
    for child in children:
        _walk(*child, out)


def _nested_doc(parent: str, name: str) -> str:
    return f"The keys of `{parent}.{name}` (documented under `[{parent}]`)."


def _key_markdown(key: KeyDoc) -> str:
    default = "required" if key.default == "" else f"default `{key.default}`"
    head = f"- **`{key.name}`** ({key.type}; {default})"
    if not key.doc:
        return head
    body = "\n".join(f"  {line}" if line else "" for line in key.doc.splitlines())
    return f"{head}:\n{body}"


def _declarations(model: type[BaseModel]) -> list[tuple[str, ast.expr | None, str]]:
    """(field name, the value it is assigned in the source, its docstring) for every
    annotated field of `model` and its config bases, bases first."""
    found: list[tuple[str, ast.expr | None, str]] = []
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        # Plain `ast.parse`, not `rldojo.pyast` (a layer-0 neighbour config may not import):
        # the reference is built by a command, never beside grading threads, and
        # `inspect.getsource` parses the module without that lock anyway.
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))  # a class in a function
        body = typing.cast(ast.ClassDef, tree.body[0]).body
        for stmt, nxt in zip(body, [*body[1:], None], strict=True):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                found.append((stmt.target.id, stmt.value, _docstring(nxt)))
    return found


def _docstring(stmt: ast.stmt | None) -> str:
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    ):
        return inspect.cleandoc(stmt.value.value)
    return ""


def _nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds as a table (`X`, `X | None`) or an array of tables
    (`list[X]`), with whether it is an array; None for a field of plain values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and args:
        item = _nested_model(args[0])
        return None if item is None else (item[0], True)
    if origin in (typing.Union, types.UnionType):
        found = [m for m in map(_nested_model, args) if m is not None]
        return found[0] if len(found) == 1 else None
    return None


def _type_text(annotation: Any, path: str) -> str:
    """The TOML-facing type: `string`, `float | None`, `"a" | "b"`, `array of string`,
    `table [model.lora]`."""
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"table `[{path}]`"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(f"`{_toml(v)}`" for v in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a, path) for a in args)
    if origin is list:
        if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return f"array of tables `[[{path}]]`"
        item = _type_text(args[0], path) if args else "any"
        item = _PLURALS.get(item, f"({item})" if " | " in item else item)
        return f"array of {item}"
    if origin is tuple:
        return "array [" + ", ".join(_type_text(a, path) for a in args) + "]"
    if origin is dict:
        return "table"
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _bounds(metadata: list[Any]) -> list[str]:
    """A field's constraints as text: `> 0`, `≤ 1`, `matching ^auto$`."""
    out: list[str] = []
    for item in metadata:
        for kind, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            bound = getattr(item, kind, None)
            if isinstance(item, annotated_types.BaseMetadata) and bound is not None:
                out.append(f"{sign} {_toml(bound)}")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"matching `{pattern}`")
    return out


def _default_text(value: ast.expr | None) -> str:
    """The declared default as a TOML literal, from the field's source (`x: int = 3`,
    `Field(3, ...)`, `Field(default_factory=...)`); "" when the field is required. A
    default computed by code prints as that code, never as its value on this machine."""
    if value is None:
        return ""
    if not (isinstance(value, ast.Call) and _called_name(value) == "Field"):
        return _literal_text(value)
    keywords = {k.arg: k.value for k in value.keywords if k.arg}
    default = value.args[0] if value.args else keywords.get("default")
    if default is not None:
        is_required = isinstance(default, ast.Constant) and default.value is Ellipsis
        return "" if is_required else _literal_text(default)
    factory = keywords.get("default_factory")
    return "" if factory is None else _factory_text(factory)


def _factory_text(factory: ast.expr) -> str:
    """What a `default_factory` makes: `[]` for `list`, the literal a lambda returns
    (through `list(...)`/`tuple(...)`), a table's own defaults for a section model,
    else the call as written."""
    if isinstance(factory, ast.Lambda):
        return _literal_text(factory.body)
    if isinstance(factory, ast.Name):
        empty = {"list": "[]", "tuple": "[]", "dict": "{}", "set": "[]"}.get(factory.id)
        if empty is not None:
            return empty
        if factory.id[:1].isupper():  # a section model: its table's defaults
            return "{}"
    return f"{ast.unparse(factory)}()"


def _literal_text(node: ast.expr) -> str:
    if (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and _called_name(node) in ("list", "tuple")
        and not node.keywords
    ):
        node = node.args[0]  # `list[Tracker](["tensorboard"])` declares ["tensorboard"]
    try:
        return _toml(ast.literal_eval(node))
    except ValueError:
        return ast.unparse(node)


def _called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Subscript):
        func = func.value
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _toml(value: Any) -> str:
    """A Python literal as a TOML inline value (None, which TOML lacks, as `None`)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are TOML's
    if isinstance(value, set):
        value = sorted(value, key=repr)  # a set's order changes from run to run
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{k if _BARE_KEY.match(str(k)) else _toml(str(k))} = {_toml(v)}"
            for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    if isinstance(value, float):
        return re.sub(r"e([+-])0+(?=\d)", r"e\1", repr(value))  # 2e-05 as written: 2e-5
    return repr(value)
