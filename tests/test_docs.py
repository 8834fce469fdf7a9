"""The files of docs/your-own-environment.md work as written.

Every fenced block whose info string names a file (```` ```python file=reverse_env.py ````)
is written into an empty directory; from there both environments pass `rldojo check-env`
(with `--show`), both train configs train one step on tiny-random, and the pyproject's
entry points name factories that build the environments they claim.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo.cli import app

runner = CliRunner()

PAGE = Path(__file__).resolve().parents[1] / "docs" / "your-own-environment.md"
FILE_BLOCK = re.compile(r"^```(\w+) file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TINY = [
    "--set", "model.name=tiny-random", "--set", "run.steps=1", "--set", "eval.tasks=2",
    "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2",
    "--set", "sampling.max_new_tokens=8", "--set", "eval.max_new_tokens=8",
]  # fmt: skip


def doc_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for _, name, body in FILE_BLOCK.findall(PAGE.read_text()):
        assert name not in files, f"{name} is defined twice in {PAGE.name}"
        files[name] = body
    return files


@pytest.fixture
def doc_dir(tmp_path, monkeypatch):
    """The page's files in tmp_path, which is also the current directory."""
    for name, body in doc_files().items():
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in doc_files():  # the page's modules, so that other tests import them afresh
        sys.modules.pop(name.removesuffix(".py"), None)


def test_the_page_marks_its_files():
    assert set(doc_files()) == {
        "reverse_env.py",
        "reverse_grader.py",
        "reverse.toml",
        "locker_env.py",
        "locker.toml",
        "pyproject.toml",
    }


@pytest.mark.parametrize(
    ("factory", "config"),
    [("reverse_env:ReverseEnv", "reverse.toml"), ("locker_env:LockerEnv", "locker.toml")],
)
@pytest.mark.slow
def test_doc_env_checks_and_trains(factory, config, doc_dir):
    check = runner.invoke(app, ["check-env", factory, "--show"])
    assert check.exit_code == 0, check.output
    assert f"check-env {factory}: PASS" in check.output
    assert "score: 1.0 (ok)" in check.output  # the reference answer earns full marks

    out = doc_dir / "runs"
    args = ["train", config, *TINY, "--set", f"run.output_dir={out}", "--set", "run.name=doc"]
    trained = runner.invoke(app, args)
    assert trained.exit_code == 0, trained.output
    assert json.loads((out / "doc" / "summary.json").read_text())["steps"] == 1


def test_doc_pyproject_entry_points_build_their_envs(doc_dir):
    from rldojo.envs.registry import make_env

    pyproject = tomllib.loads((doc_dir / "pyproject.toml").read_text())
    entries = pyproject["project"]["entry-points"]["rldojo.envs"]
    assert entries
    modules = set(pyproject["tool"]["setuptools"]["py-modules"])
    for env_id, target in entries.items():
        assert target.partition(":")[0] in modules
        assert make_env(target).env_id == env_id


def test_doc_locker_grader_reads_the_answer_from_info(doc_dir):
    import asyncio

    from rldojo.envs.registry import make_env
    from rldojo.types import Rollout

    env = make_env("locker_env:LockerEnv")
    task = env.tasks("train", n=1)[0]

    async def play(turns):
        await env.reset(task, seed=0)
        info = {}
        for turn in turns:
            result = await env.step(turn)
            info.update(result.info)
        rollout = Rollout(task.id, env.env_id, [], completion=turns[-1], info=info)
        return result, await env.default_grader().grade(rollout, task)

    locker = task.prompt.split("locker ")[1].rstrip("?")
    call = json.dumps({"name": "lookup", "arguments": {"locker": int(locker)}})
    first, _ = asyncio.run(play([f"<tool_call>{call}</tool_call>"]))
    assert task.answer in first.messages[0]["content"]  # the tool told the policy the PIN
    _, right = asyncio.run(
        play([f"<tool_call>{call}</tool_call>", f"<answer>{task.answer}</answer>"])
    )
    _, wrong = asyncio.run(play(["<answer>nope</answer>"]))
    assert right.value == 1.0 and wrong.value == 0.0
