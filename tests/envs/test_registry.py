"""The environment registry: ids, duplicates, unknown ids, module:factory paths, built-ins."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rldojo.envs import registry
from rldojo.envs.base import Env, SingleTurnEnv
from rldojo.envs.registry import UnknownEnvError, list_envs, make_env, register


class TinyEnv(SingleTurnEnv):
    env_id = "tiny-v1"

    def __init__(self, size: int = 1) -> None:
        super().__init__()
        self.size = size

    def default_grader(self) -> None:
        return None


@pytest.fixture(autouse=True)
def clean_registry():
    registry.ENVS.load()
    saved = dict(registry.ENVS.plugins)
    yield
    registry.ENVS.plugins.clear()
    registry.ENVS.plugins.update(saved)


def test_register_and_make() -> None:
    register("tiny-v1", TinyEnv)
    env = make_env("tiny-v1", size=3)
    assert isinstance(env, TinyEnv) and isinstance(env, Env)
    assert env.size == 3
    assert "tiny-v1" in list_envs()
    assert list_envs() == sorted(list_envs())


def test_duplicate_needs_overwrite() -> None:
    register("tiny-v1", TinyEnv)
    with pytest.raises(ValueError, match="already registered"):
        register("tiny-v1", TinyEnv)
    register("tiny-v1", lambda **kw: TinyEnv(size=9), overwrite=True)
    assert make_env("tiny-v1").size == 9
    with pytest.raises(ValueError, match="already registered"):  # built-ins count too
        register("arith-v1", TinyEnv)


@pytest.mark.parametrize(
    "bad", ["tiny", "Tiny-v1", "tiny-v", "tiny-vx", "-tiny-v1", "tiny v1", "tiny-v1 ", ""]
)
def test_bad_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid environment id"):
        register(bad, TinyEnv)


def test_good_ids() -> None:
    for good in ("a-v0", "crm.sales-v2", "my_env-2-v10"):
        register(good, TinyEnv)
    with pytest.raises(ValueError, match="not callable"):
        register("x-v1", 3)  # type: ignore[arg-type]


def test_unknown_id_message_lists_known_ids() -> None:
    with pytest.raises(UnknownEnvError) as info:
        make_env("arith-v2")
    assert isinstance(info.value, KeyError)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("unknown environment 'arith-v2' (did you mean 'arith-v1'?)")
    assert "known: " in message and "arith-v1" in message and "math-v1" in message


def test_builtins_are_listed() -> None:
    assert {"arith-v1", "math-v1"} <= set(list_envs())
    assert set(registry.BUILTIN_MODULES) >= {"rldojo.envs.arith.env", "rldojo.envs.math.env"}


def test_module_factory_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rldojo_test_envmod.py").write_text(
        textwrap.dedent(
            """
            from rldojo.envs.base import SingleTurnEnv

            class Custom(SingleTurnEnv):
                env_id = "custom-v1"
                def __init__(self, tag="none"):
                    super().__init__()
                    self.tag = tag
                def default_grader(self):
                    return None

            def make(**kwargs):
                return Custom(**kwargs)

            factories = {"x": make}
            not_an_env = lambda: 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("rldojo_test_envmod:make", tag="hello")
    assert type(env).__name__ == "Custom" and env.tag == "hello"  # type: ignore[attr-defined]
    assert make_env("rldojo_test_envmod:Custom").env_id == "custom-v1"
    with pytest.raises(UnknownEnvError, match="has no attribute 'nope'"):
        make_env("rldojo_test_envmod:nope")
    with pytest.raises(UnknownEnvError, match="no module named 'rldojo_no_such_mod'"):
        make_env("rldojo_no_such_mod:make")
    with pytest.raises(TypeError, match="not an Env"):
        make_env("rldojo_test_envmod:not_an_env")


@pytest.mark.slow
def test_import_is_cheap() -> None:
    code = "import sys, rldojo.envs; print('rldojo.envs.arith.env' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("first", ["rldojo.envs.arith.env", "rldojo.envs.math.env"])
@pytest.mark.slow
def test_importing_a_builtin_module_first_still_registers_all(first: str) -> None:
    code = f"import {first}; from rldojo.envs import list_envs; print(list_envs())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "'arith-v1'" in out.stdout and "'math-v1'" in out.stdout
    assert "Warning" not in out.stderr


MODULE = """
from rldojo.envs.base import SingleTurnEnv

class {cls}(SingleTurnEnv):
    env_id = "{env_id}"
    def default_grader(self):
        return None
"""


def test_module_factory_path_resolves_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rldojo_cwd_envmod.py").write_text(MODULE.format(cls="Here", env_id="here-v1"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)  # `python -m`-like: ./rldojo_cwd_envmod.py, no PYTHONPATH
    assert make_env("rldojo_cwd_envmod:Here").env_id == "here-v1"


def test_installed_packages_register_envs_through_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real distribution on sys.path (dist-info with entry_points.txt), as pip leaves it."""
    (tmp_path / "rldojo_ep_envs.py").write_text(MODULE.format(cls="Rev", env_id="reverse-v1"))
    info = tmp_path / "rldojo_ep_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rldojo-ep-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rldojo.envs]\nreverse-v1 = rldojo_ep_envs:Rev\nbroken-v1 = rldojo_ep_missing:Nope\n"
        "Bad_Id = rldojo_ep_envs:Rev\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry.ENVS, "errors", {})
    registry.ENVS.load_entry_points()
    assert {"reverse-v1", "broken-v1"} <= set(list_envs()) and "Bad_Id" not in list_envs()
    assert "rldojo_ep_envs" not in sys.modules  # loaded on first use only
    assert make_env("reverse-v1").env_id == "reverse-v1"
    with pytest.raises(UnknownEnvError, match=r"broken-v1.*entry point rldojo_ep_missing:Nope"):
        make_env("broken-v1")
    with pytest.raises(UnknownEnvError, match=r"environments that failed to load: .*Bad_Id"):
        make_env("nope-v1")
