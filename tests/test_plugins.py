"""Plugins: an installed distribution (a real dist-info with entry points) adds an
environment, a grader and an expert; `rldojo plugins` lists them with their origin; a
config names a grader by path or by name; kwargs models give one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo.cli import app
from rldojo.config import load_config
from rldojo.envs.experts import EXPERTS, expert_for
from rldojo.envs.registry import ENVS, EnvKwargsError, make_env
from rldojo.graders import GraderSpecError, load
from rldojo.graders.specs.context import GRADERS
from rldojo.training.inputs import build_mixture
from rldojo.types import Rollout, Task

runner = CliRunner()

PACKAGE = '''
"""A third-party plugin package: an env, a grader and an expert for it."""
import os
from pathlib import Path

from pydantic import Field

from rldojo.envs.base import SingleTurnEnv
from rldojo.envs.kwargs import EnvKwargs
from rldojo.types import Score, Task

marker = os.environ.get("RLDOJO_TP_MARKER")
if marker:
    Path(marker).write_text("imported")


class EchoKwargs(EnvKwargs):
    word: str = "hi"
    """The word to echo."""
    repeat: int = Field(1, ge=1)
    """How many times to say it."""


class EchoEnv(SingleTurnEnv):
    env_id = "echo-v1"
    Kwargs = EchoKwargs

    def __init__(self, word="hi", repeat=1):
        super().__init__()
        self.word, self.repeat = word, repeat

    def tasks(self, split="train", *, seed=0, n=None):
        return [Task(id=f"echo/{split}/{i}", prompt=f"Say {self.word}", answer=self.word,
                     env="echo-v1") for i in range(n or 3)]

    def default_grader(self):
        return make_grader()


class EchoGrader:
    def __init__(self, target=None, bonus=0.0):
        self.target, self.bonus = target, bonus

    async def grade(self, rollout, task):
        want = self.target or task.answer
        hit = rollout.completion.strip() == want
        return Score(value=float(hit) + self.bonus, components={"correct": float(hit)})


def make_grader(**kwargs):
    return EchoGrader(**kwargs)


class EchoExpert:
    def act(self, messages, task):
        return task.answer


def make_expert(env_id, **env_kwargs):
    return EchoExpert()
'''


@pytest.fixture
def dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`rldojo-tp-plugin 0.3` installed the way pip leaves it, and the registries reloaded
    (restored afterwards)."""
    site = tmp_path / "site"
    (site / "rldojo_tp_plugin").mkdir(parents=True)
    (site / "rldojo_tp_plugin" / "__init__.py").write_text(PACKAGE)
    info = site / "rldojo_tp_plugin-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rldojo-tp-plugin\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """
            [rldojo.envs]
            echo-v1 = rldojo_tp_plugin:EchoEnv
            [rldojo.graders]
            echo_match = rldojo_tp_plugin:make_grader
            [rldojo.experts]
            echo-v1 = rldojo_tp_plugin:make_expert
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    saved = []
    for registry in (ENVS, GRADERS, EXPERTS):
        registry.load()
        saved.append((registry, dict(registry.plugins), dict(registry.errors)))
        registry.load_entry_points()
    yield site
    for registry, plugins, errors in saved:
        registry.plugins.clear()
        registry.plugins.update(plugins)
        registry.errors.clear()
        registry.errors.update(errors)
    sys.modules.pop("rldojo_tp_plugin", None)


@pytest.mark.slow  # a fresh interpreter
def test_rldojo_plugins_lists_installed_plugins_and_their_origin(dist: Path) -> None:
    marker = dist.parent / "imported"
    env = {**os.environ, "PYTHONPATH": str(dist), "RLDOJO_TP_MARKER": str(marker)}
    done = subprocess.run(
        [sys.executable, "-m", "rldojo.cli", "plugins", "--json"],
        capture_output=True, text=True, env=env, cwd=dist.parent, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    installed = {
        "origin": "entry point",
        "distribution": "rldojo-tp-plugin",
        "version": "0.3",
    }
    envs = {row["name"]: row for row in report["envs"]}
    assert envs["echo-v1"] == {"name": "echo-v1", **installed, "target": "rldojo_tp_plugin:EchoEnv"}
    assert envs["arith-v1"] == {
        "name": "arith-v1",
        "origin": "builtin",
        "target": "rldojo.envs.arith.env:ArithEnv",
    }
    graders = {row["name"]: row for row in report["graders"]}
    assert graders["echo_match"]["target"] == "rldojo_tp_plugin:make_grader"
    assert graders["echo_match"]["distribution"] == "rldojo-tp-plugin"
    assert graders["string_check"]["origin"] == "builtin"
    experts = {row["name"]: row for row in report["experts"]}
    assert experts["echo-v1"] == {
        "name": "echo-v1",
        **installed,
        "target": "rldojo_tp_plugin:make_expert",
    }
    assert experts["crm-v1"]["target"] == "rldojo.envs.crm.expert:make_expert"
    assert report["errors"] == {"envs": {}, "graders": {}, "experts": {}}
    assert not marker.exists()  # listed without importing the package


def test_the_table_names_the_distribution(dist: Path) -> None:
    result = runner.invoke(app, ["plugins"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "echo_match" in x)
    assert "entry point" in line and "rldojo-tp-plugin 0.3" in line


def _echo_rollout(task: Task, text: str) -> Rollout:
    return Rollout(task.id, task.env, [{"role": "assistant", "content": text}], text)


def test_a_config_names_a_grader_by_path_and_it_grades(dist: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[env]\nid = "echo-v1"\nkwargs = { word = "yo" }\n'
        '[grader]\nspec = "rldojo_tp_plugin:make_grader"\n'
    )
    cfg = load_config(str(config))
    mixture = build_mixture(cfg)
    task = mixture.slots["echo-v1"].train_tasks[0]
    grader = mixture.grader()
    good = asyncio.run(grader.grade(_echo_rollout(task, "yo"), task))
    bad = asyncio.run(grader.grade(_echo_rollout(task, "no"), task))
    assert (good.value, bad.value) == (1.0, 0.0)
    assert grader.graders["echo-v1"].name == "rldojo_tp_plugin:make_grader"


def test_a_grader_type_takes_the_tables_keys_and_installed_names_work(dist: Path) -> None:
    task = Task(id="t", prompt="Say x", answer="x", env="echo-v1")
    table = load({"type": "rldojo_tp_plugin:make_grader", "target": "z", "bonus": 0.5})
    assert asyncio.run(table.grade(_echo_rollout(task, "z"), task)).value == 1.5
    by_name = load("echo_match")  # the entry point's name, as `grader.spec = "echo_match"`
    assert asyncio.run(by_name.grade(_echo_rollout(task, "x"), task)).value == 1.0
    inside = load({"type": "multi", "graders": {"e": {"type": "echo_match", "bonus": 1.0}},
                   "calculate_output": "e"})  # fmt: skip
    assert asyncio.run(inside.grade(_echo_rollout(task, "x"), task)).value == 2.0
    with pytest.raises(GraderSpecError, match=r"^spec: echo_match: .*'nope'"):
        load({"type": "echo_match", "nope": 1})
    with pytest.raises(GraderSpecError, match=r"^spec.type: grader type 'no_mod:x': no module"):
        load("no_mod:x")


def test_installed_env_and_expert_play_demos(dist: Path, tmp_path: Path) -> None:
    env = make_env("echo-v1", word="ok")
    assert env.tasks("train", n=1)[0].prompt == "Say ok"
    task = env.tasks("train", n=1)[0]
    assert expert_for("echo-v1").act([], task) == "ok"
    # another env played by an expert named by path
    assert expert_for("tictactoe-v1", expert="rldojo_tp_plugin:make_expert").act([], task) == "ok"
    out = tmp_path / "demos.jsonl"
    result = runner.invoke(app, ["demos", "echo-v1", "--n", "2", "--out", str(out),
                                 "--env-kwargs", '{"word": "hey"}'])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(row["messages"][-1]["content"] == "hey" for row in rows)


def test_bad_kwargs_of_an_installed_env_are_one_line_naming_the_key(
    dist: Path, tmp_path: Path
) -> None:
    with pytest.raises(EnvKwargsError) as info:
        make_env("echo-v1", wrod="x")
    assert str(info.value) == (
        "env.kwargs.wrod: echo-v1 takes no argument 'wrod' (did you mean 'word'?); "
        "it takes: word, repeat"
    )
    with pytest.raises(EnvKwargsError) as info:
        make_env("echo-v1", repeat=0)
    assert str(info.value) == (
        "env.kwargs.repeat: echo-v1: expected a value greater than or equal to 1, got 0"
    )
    result = runner.invoke(app, ["check-env", "echo-v1", "--kwargs", '{"repeat": "2"}'])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: env.kwargs.repeat: echo-v1: expected a valid integer, got '2'"
    ]
