"""Which Chromium web-crm-v1 finds, on a machine made of fake executables: the kwarg, then
`RLDOJO_CHROMIUM`, then Playwright's own browser (where Playwright's real driver says it
lives), then `chromium` / `chromium-browser` / `google-chrome` on the PATH; and no browser
at all is a one-line `EnvUnavailableError` (the machine's problem, not the config's)
saying how to get one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.commands.doctor import _chromium_row
from rldojo.envs.base import EnvUnavailableError
from rldojo.envs.registry import EnvKwargsError, make_env
from rldojo.envs.web_crm.browser import BrowserPool
from rldojo.envs.web_crm.chromium import Chromium, find_chromium, playwright_chromium

pytestmark = pytest.mark.slow  # asks Playwright's driver (a Node process) where its browser is

HOW = (
    "apt-get install chromium (or your distribution's package), or pip install playwright "
    "&& playwright install chromium; or name a binary with env.kwargs.chromium_path or "
    "RLDOJO_CHROMIUM"
)


def executable(path: Path) -> str:
    """A shell script at `path` that does nothing: a stand-in browser binary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def no_playwright_browser(tmp_path_factory):
    """A `PLAYWRIGHT_BROWSERS_PATH` with nothing installed in it (one per module, so the
    driver is asked once)."""
    return str(tmp_path_factory.mktemp("ms-playwright"))


@pytest.fixture
def machine(tmp_path, monkeypatch, no_playwright_browser):
    """A PATH of one empty directory, no Playwright browser, no `RLDOJO_CHROMIUM`."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", no_playwright_browser)
    monkeypatch.delenv("RLDOJO_CHROMIUM", raising=False)
    return tmp_path


def test_the_kwarg_then_the_variable_then_playwright_then_the_path(machine, monkeypatch):
    executable(machine / "bin" / "google-chrome")
    assert find_chromium() == Chromium(str(machine / "bin" / "google-chrome"), "PATH")
    chromium = executable(machine / "bin" / "chromium")
    assert find_chromium() == Chromium(chromium, "PATH")  # Debian's name first
    assert _chromium_row() == ("chromium", "ok", f"{chromium} (PATH; web-crm-v1)")  # doctor

    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(machine / "pw"))
    own = playwright_chromium()  # where `playwright install chromium` would put it
    assert own is not None and own.startswith(str(machine / "pw"))
    executable(Path(own))
    assert find_chromium() == Chromium(own, "Playwright")

    monkeypatch.setenv("RLDOJO_CHROMIUM", executable(machine / "env" / "chrome"))
    assert find_chromium() == Chromium(str(machine / "env" / "chrome"), "RLDOJO_CHROMIUM")

    given = executable(machine / "given" / "chrome")
    assert find_chromium(given) == Chromium(given, "env.kwargs.chromium_path")


def test_no_browser_is_one_line_saying_how_to_get_one(machine, monkeypatch):
    with pytest.raises(EnvUnavailableError) as missing:
        find_chromium()
    assert str(missing.value) == f"no Chromium found: {HOW}"
    assert _chromium_row() == ("chromium", "missing", f"web-crm-v1: no Chromium found: {HOW}")
    # the environment says so when it is made: not a kwargs (config) error
    with pytest.raises(EnvUnavailableError) as missing:
        make_env("web-crm-v1")
    assert not isinstance(missing.value, EnvKwargsError)
    assert str(missing.value) == f"web-crm-v1: no Chromium found: {HOW}"
    # a named binary that is not there is named
    nowhere = str(machine / "nowhere" / "chromium")
    with pytest.raises(EnvUnavailableError) as missing:
        make_env("web-crm-v1", chromium_path=nowhere)
    assert str(missing.value) == (f"web-crm-v1: env.kwargs.chromium_path = {nowhere!r} is not "
                                  f"an executable file; to get a Chromium: {HOW}")  # fmt: skip
    monkeypatch.setenv("RLDOJO_CHROMIUM", str(machine / "bin"))  # a directory
    with pytest.raises(EnvUnavailableError, match=r"^RLDOJO_CHROMIUM = '.*/bin' is not an exec"):
        find_chromium()


def test_a_pool_without_a_named_binary_finds_none_at_launch(machine):
    pool = BrowserPool(max_contexts=1)
    try:
        with pytest.raises(EnvUnavailableError, match=r"^no Chromium found: apt-get"):
            pool.open_sync("http://127.0.0.1:9")  # refused before any browser or page
        assert pool.browser_pid is None and pool.executable is None
    finally:
        pool.close()


def test_a_command_shows_a_missing_browser_as_one_line(machine):
    args = ["eval", "--env", "web-crm-v1", "--model", "tiny-random", "--tasks", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: web-crm-v1: no Chromium found: {HOW}"


def test_playwright_not_installed_is_the_same_kind_of_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright", None)  # how Python blocks an import
    with pytest.raises(EnvUnavailableError) as missing:
        make_env("web-crm-v1")
    assert str(missing.value) == (
        "web-crm-v1: Playwright is not installed: pip install 'rldojo[web]'"
    )
