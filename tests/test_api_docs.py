"""docs/api.md works as written: its Python blocks run in order, in one namespace, in an
empty directory holding the page's files (```` ```python file=NAME ````), and do what
the page says they do."""

from __future__ import annotations

import importlib
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BLOCK = re.compile(r"^```(\w+)( file=\S+)?\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> tuple[dict[str, str], list[str]]:
    """The page's files (name -> text) and its Python blocks to run, in order; each block
    is padded with blank lines, so a traceback's line numbers are the page's."""
    page = PAGE.read_text()
    files: dict[str, str] = {}
    code: list[str] = []
    for match in BLOCK.finditer(page):
        lang, file, body = match.groups()
        if file:
            files[file.removeprefix(" file=")] = body
        elif lang == "python":
            code.append("\n" * page.count("\n", 0, match.start(3)) + body)
    return files, code


def test_the_page_has_its_examples():
    files, code = blocks()
    assert set(files) == {"short_grader.py", "pyproject.toml"}
    joined = "\n".join(code)
    for call in (
        "rldojo.train(",
        "rldojo.evaluate(",
        "rldojo.Callback",
        "short_grader:make",
        "reward_weights=",
    ):
        assert call in joined


def test_the_entry_point_names_the_factory(tmp_path, monkeypatch):
    files, _ = blocks()
    (tmp_path / "short_grader.py").write_text(files["short_grader.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    points = tomllib.loads(files["pyproject.toml"])["project"]["entry-points"]["rldojo.graders"]
    module, _, attr = points["short"].partition(":")
    grader = getattr(importlib.import_module(module), attr)(max_chars=5)
    assert grader.name == "short" and grader.max_chars == 5
    sys.modules.pop(module, None)


KEYS = ("task_id", "passed", "value", "status")


def after_rows(run_dir: Path) -> list[tuple[object, ...]]:
    """Each task's line of the run's "after" evaluation (`RUN/evals/after.jsonl`)."""
    lines = (run_dir / "evals" / "after.jsonl").read_text().splitlines()
    return [tuple(json.loads(line)[k] for k in KEYS) for line in lines]


@pytest.mark.slow
def test_the_examples_run(tmp_path, monkeypatch, capsys):
    files, code = blocks()
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two shared cores: one thread is faster
    namespace: dict[str, object] = {"__name__": "api_docs"}
    try:
        for body in code:
            exec(compile(body, "docs-api-md", "exec"), namespace)  # line numbers: the page's
    finally:
        sys.modules.pop("short_grader", None)
    ns = namespace
    result, held_out, early, graded = ns["result"], ns["held_out"], ns["early"], ns["graded"]
    trl_run = ns["trl_run"]
    assert result.checkpoint == Path("runs/sums/checkpoints/step_000002")  # type: ignore[attr-defined]
    assert result.stopped == "steps"  # type: ignore[attr-defined]
    assert held_out.accuracy == result.accuracy_after  # type: ignore[attr-defined]
    assert (early.stopped, early.summary["steps"]) == ("callback", 3)  # type: ignore[attr-defined]
    assert graded.summary["evals"]["after"]["statuses"] == {"ok": 4}  # type: ignore[attr-defined]
    assert ns["tuned"].summary["model"].startswith("object:LlamaForCausalLM.")  # type: ignore[attr-defined]
    grades = {key.split("/")[1] for key in trl_run.summary["statuses"]}  # type: ignore[attr-defined]
    assert grades == {"ok"}  # both functions, batched and per sample, graded every sample
    assert 'id = "reward.answered.brief-v1"' in (trl_run.run_dir / "config.toml").read_text()  # type: ignore[attr-defined]
    out = capsys.readouterr().out
    assert "callback 3" in out and "{'ok': 4}" in out and "\n3584\n" in out
    again = [tuple(r[k] for k in KEYS) for r in ns["again"].rows]  # type: ignore[attr-defined]
    assert again == after_rows(graded.run_dir)  # type: ignore[attr-defined]
