"""Every figure traceable: the checks that keep benchmarks/results/ honest.

Four checks, each a function that returns its problems (an empty list when all is well),
run on this repository and, once each, on a small git repository built in a temporary
folder where the check must fail:

1. `manifest_problems`: every result in the layout benchmarks/results/<benchmark>/<label>.json
   has a complete manifest (`results_io.MANIFEST_KEYS`) whose script exists.
2. `legacy_problems`: every flat file (the results that predate `results_io`) is in
   benchmarks/results/LEGACY.json, and the index is what `legacy_index.py` builds from git
   history now (a file edited, added or removed since makes it stale).
3. `script_problems`: a legacy file's producing script exists, or the file is one of
   `WITHOUT_SCRIPT` (the index records them with `script_exists: false`).
4. `citation_problems`: every `benchmarks/results/...` or `results/...` path that
   README.md, docs/**/*.md or benchmarks/README.md cite exists.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import legacy_index  # noqa: E402
import results_io  # noqa: E402

# Legacy files no script in benchmarks/ wrote: assembled from `rldojo` commands (listed in
# the file), or written by a script that was never committed. Nothing else may lack one.
WITHOUT_SCRIPT = {
    "agentic_arith_tools_level3_transfer.json",
    "agentic_crm_full_sft_t05.json",
    "agentic_tictactoe_reeval_512.json",
    "sft_replay_cuda.json",
}
# A cited path: `benchmarks/results/...` anywhere, or `results/...` not inside another path.
CITED = re.compile(r"(?<![\w/.-])((?:benchmarks/)?results/[^\s`'\"()\[\]|]*)")


def _shallow(root: Path) -> bool:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-shallow-repository"],
                          capture_output=True, text=True)  # fmt: skip
    return done.returncode != 0 or done.stdout.strip() != "false"


def manifest_problems(root: Path) -> list[str]:
    problems = []
    for path in sorted((root / "benchmarks" / "results").glob("*/*.json")):
        rel = path.relative_to(root)
        doc = json.loads(path.read_text())
        missing = results_io.is_complete(doc)
        if missing:
            problems.append(f"{rel}: manifest lacks {', '.join(missing)}")
            continue
        found = doc["manifest"]
        # Not checked: that the file sits at <benchmark>/<label>.json, since `--out FILE`
        # (gpu_check.sh's files under results/gpu_check/) puts it elsewhere on purpose.
        if not (root / found["script"]).is_file():
            problems.append(f"{rel}: its script {found['script']} does not exist")
    return problems


def legacy_problems(root: Path) -> list[str]:
    index_path = root / "benchmarks" / "results" / "LEGACY.json"
    if not index_path.exists():
        return [f"{index_path.name} is missing: run python benchmarks/legacy_index.py"]
    index = json.loads(index_path.read_text())
    fresh = legacy_index.build(root)
    problems = [f"{name} is not in LEGACY.json" for name in fresh["files"]
                if name not in index["files"]]  # fmt: skip
    problems += [f"{name}: not committed (new results go to benchmarks/results/<benchmark>/)"
                 for name, e in fresh["files"].items() if e["added"] is None]  # fmt: skip
    if legacy_index.render(fresh) != index_path.read_text():
        changed = sorted(n for n in fresh["files"] | index["files"]
                         if fresh["files"].get(n) != index["files"].get(n))  # fmt: skip
        problems.append(f"LEGACY.json is stale ({', '.join(changed) or 'layout'}): "
                        "run python benchmarks/legacy_index.py")  # fmt: skip
    return problems


def script_problems(root: Path, allowed: set[str] = WITHOUT_SCRIPT) -> list[str]:
    index = legacy_index.build(root)["files"]
    return [f"{name}: its script {e['script']} does not exist" for name, e in index.items()
            if not e["script_exists"] and name not in allowed]  # fmt: skip


def citation_problems(root: Path) -> list[str]:
    problems = []
    for pattern in legacy_index.CITING:
        for doc in sorted(root.glob(pattern)):
            for number, line in enumerate(doc.read_text().splitlines(), 1):
                for match in CITED.finditer(line):
                    cited = match.group(1).rstrip(".,;:")
                    if any(c in cited for c in "<*{"):  # a pattern, not a file
                        continue
                    base = root if cited.startswith("benchmarks/") else root / "benchmarks"
                    if not (base / cited).exists():
                        rel = doc.relative_to(root)
                        problems.append(f"{rel}:{number}: {cited} does not exist")
    return problems


def test_every_new_layout_result_has_a_complete_manifest():
    assert manifest_problems(ROOT) == []


@pytest.mark.slow
def test_every_legacy_file_is_indexed_and_the_index_is_current():
    if _shallow(ROOT):
        pytest.skip("a shallow clone: git log cannot name the commits that added the files")
    assert legacy_problems(ROOT) == []


@pytest.mark.slow
def test_every_legacy_file_has_its_script_or_is_marked_without_one():
    index = json.loads((ROOT / "benchmarks" / "results" / "LEGACY.json").read_text())["files"]
    assert {n for n, e in index.items() if not e["script_exists"]} == WITHOUT_SCRIPT
    assert all(index[n]["hand_edited"] for n in WITHOUT_SCRIPT)
    assert script_problems(ROOT) == []


def test_every_cited_result_exists():
    assert citation_problems(ROOT) == []


# -- each check, failing once, on a small repository of its own ---------------------------


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed repository with one script, one legacy result, its index and a README."""
    bench = tmp_path / "benchmarks"
    (bench / "results").mkdir(parents=True)
    (bench / "env_workers.py").write_text('result = {"machine": 1, "results": 2}\n')
    (bench / "results" / "env_workers.json").write_text('{"machine": 1, "results": 2}\n')
    (tmp_path / "README.md").write_text("Figures: `benchmarks/results/env_workers.json`.\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "results")
    index = legacy_index.build(tmp_path)
    (bench / "results" / "LEGACY.json").write_text(legacy_index.render(index))
    return tmp_path


def test_the_checks_pass_on_a_consistent_repository(repo: Path):
    assert legacy_problems(repo) == []
    assert script_problems(repo) == []
    assert citation_problems(repo) == []
    assert manifest_problems(repo) == []


def test_a_result_without_a_complete_manifest_fails(repo: Path):
    folder = repo / "benchmarks" / "results" / "env_workers"
    folder.mkdir()
    (folder / "default.json").write_text('{"manifest": {"benchmark": "env_workers"}}')
    (folder / "bare.json").write_text('{"results": 2}')
    problems = manifest_problems(repo)
    assert problems[0].startswith("benchmarks/results/env_workers/bare.json: manifest lacks")
    assert "label" in problems[1] and "git" in problems[1]


def test_a_complete_manifest_passes_and_names_its_script(repo: Path, monkeypatch):
    out = repo / "benchmarks" / "results"
    # (under pytest-xdist a worker's __main__ has no __file__)
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(ROOT / "benchmarks/x.py"),
                        raising=False)  # fmt: skip
    path = results_io.write_result("env_workers", "default", {"results": 2}, out_dir=out)
    doc = json.loads(path.read_text())
    assert results_io.is_complete(doc) == [] and doc["results"] == 2
    assert manifest_problems(repo) == ["benchmarks/results/env_workers/default.json: its "
                                       "script benchmarks/x.py does not exist"]  # fmt: skip
    (repo / "benchmarks" / "x.py").write_text("")
    assert manifest_problems(repo) == []


def test_an_unindexed_or_edited_legacy_file_fails(repo: Path):
    results = repo / "benchmarks" / "results"
    (results / "env_workers.json").write_text('{"machine": 1, "results": 2, "note": "x"}\n')
    assert legacy_problems(repo) == [
        "LEGACY.json is stale (env_workers.json): run python benchmarks/legacy_index.py"
    ]
    (results / "env_workers_2.json").write_text("{}")
    problems = legacy_problems(repo)
    assert "env_workers_2.json is not in LEGACY.json" in problems
    assert any(p.startswith("env_workers_2.json: not committed") for p in problems)


def test_the_index_marks_keys_no_script_writes(repo: Path):
    results = repo / "benchmarks" / "results"
    (results / "env_workers.json").write_text('{"machine": 1, "results": 2, "note": "x"}\n')
    _git(repo, "commit", "-qam", "a note by hand")
    entry = legacy_index.build(repo)["files"]["env_workers.json"]
    assert entry["keys_not_written"] == ["note"] and entry["hand_edited"]
    assert entry["added"] != entry["last_changed"]


def test_a_missing_script_fails_unless_the_file_is_marked(repo: Path):
    (repo / "benchmarks" / "env_workers.py").unlink()
    assert script_problems(repo) == [
        "env_workers.json: its script benchmarks/env_workers.py does not exist"
    ]
    assert script_problems(repo, allowed={"env_workers.json"}) == []


def test_a_cited_result_that_does_not_exist_fails(repo: Path):
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text(
        "See results/gone.json, `benchmarks/results/<bench>/<label>.json` (a pattern)\n"
        "and benchmarks/results/env_workers.json.\n"
    )
    assert citation_problems(repo) == ["docs/a.md:1: results/gone.json does not exist"]
    shutil.rmtree(repo / "docs")
    assert citation_problems(repo) == []
