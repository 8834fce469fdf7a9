"""The generated config reference (docs/config.md) and `rldojo config`: the committed page
is the generated one, every table and key is on it, and defaults are the declared ones."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.config import TrainConfig, load_config
from rldojo.config.base import _Section
from rldojo.config.reference import DOC_PATH, field_docs, markdown, tables

ROOT = Path(__file__).parent.parent
STALE = "docs/config.md is stale: run rldojo config --markdown --out docs/config.md"
runner = CliRunner()


def _assert_current(page: Path) -> None:
    committed = page.read_text(encoding="utf-8") if page.exists() else ""
    assert committed == markdown(), STALE


def test_committed_page_is_the_generated_one():
    _assert_current(ROOT / DOC_PATH)


def test_a_stale_page_fails_with_the_command_that_mends_it(tmp_path):
    stale = tmp_path / "config.md"
    stale.write_text(markdown().replace("Rank of each adapter", "Rank of the adapter"))
    with pytest.raises(AssertionError, match=re.escape(STALE)):
        _assert_current(stale)


def test_every_table_has_a_section_in_config_order():
    headings = re.findall(r"^## `(.+)`$", markdown(), flags=re.M)
    assert headings == [
        "[model]", "[model.lora]", "[env]", "[[env.mix]]", "[grader]", "[sampling]",
        "[generation]", "[rollout]", "[loss]", "[curriculum]", "[optim]", "[eval]", "[run]",
        "[sft]", "[distill]",
    ]  # fmt: skip


@pytest.mark.slow
def test_every_key_is_listed_with_its_docstring():
    page = markdown()
    for table in tables():
        section = page.split(f"## `{table.heading}`\n", 1)[1].split("\n## ", 1)[0]
        for key in table.keys:
            assert f"- **`{key.name}`** (" in section, f"{table.path}.{key.name}"
            first_line = key.doc.splitlines()[0]
            assert f"  {first_line}" in section, f"{table.path}.{key.name}"
    rho = next(k for t in tables() if t.path == "loss" for k in t.keys if k.name == "rho")
    assert (rho.type, rho.default) == ("float, > 0.0, ≤ 1.0", "0.2")
    assert field_docs(TrainConfig)["loss"] == "The forking-token policy-gradient loss."


def test_printed_defaults_are_the_models_defaults_as_toml():
    """Each default on the page, read back as TOML, equals pydantic's default: the page
    reads defaults from the source, so this catches a misread declaration."""
    compared = 0
    for table in tables():
        for key in table.keys:
            field = table.model.model_fields[key.name]
            where = f"{table.path}.{key.name}"
            if key.default == "":
                assert field.is_required(), where
                continue
            value = field.get_default(call_default_factory=True)
            if key.default == "None" or isinstance(value, BaseModel):
                assert value is None or key.default == "{}", where
                continue
            expected = list(value) if isinstance(value, tuple) else value
            assert tomllib.loads(f"v = {key.default}")["v"] == expected, where
            compared += 1
    assert compared > 80


class _Machine(_Section):
    threads: int = Field(default_factory=os.cpu_count)  # type: ignore[arg-type]
    """Threads: this machine's cores."""
    name: str = Field(...)
    """Required."""


class _Root(_Section):
    machine: _Machine = Field(default_factory=lambda: _Machine(name="x"))
    """A table whose default depends on the machine."""


def test_a_default_computed_on_the_machine_prints_as_declared():
    (table,) = tables(_Root)
    assert table.heading == "[machine]"
    assert table.doc == "A table whose default depends on the machine."
    keys = {k.name: k for k in table.keys}
    assert keys["threads"].default == "os.cpu_count()"
    assert keys["name"].default == ""
    page = markdown(_Root)
    assert "- **`threads`** (integer; default `os.cpu_count()`):" in page
    assert "- **`name`** (string; required):" in page


def test_cli_markdown_prints_and_writes_the_page(tmp_path):
    result = runner.invoke(app, ["config", "--markdown"])
    assert result.exit_code == 0
    assert result.output == markdown()
    out = tmp_path / "docs" / "config.md"
    result = runner.invoke(app, ["config", "--markdown", "--out", str(out)])
    assert result.exit_code == 0
    assert out.read_text(encoding="utf-8") == markdown()


def test_cli_prints_the_resolved_config_as_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[loss]\nrho = 0.5\n")
    result = runner.invoke(app, ["config", str(path), "--set", "run.steps=3"])
    assert result.exit_code == 0
    written = tmp_path / "resolved.toml"
    written.write_text(result.output)
    assert load_config(written) == load_config(path, ["run.steps=3"])
    assert load_config(written).loss.rho == 0.5


def test_cli_markdown_with_a_config_is_a_usage_error():
    result = runner.invoke(app, ["config", "--markdown", "x.toml"])
    assert result.exit_code == 2
    assert "takes no CONFIG" in result.output
