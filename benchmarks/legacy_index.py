"""The provenance of the flat result files written before `results_io`, from git history.

    python benchmarks/legacy_index.py             # (re)writes benchmarks/results/LEGACY.json
    python benchmarks/legacy_index.py --check     # exit 1 when LEGACY.json is stale
    python benchmarks/legacy_index.py --uncited   # flat files no README or doc cites

benchmarks/results/*.json (flat names, no manifest) predate the layout
benchmarks/results/<benchmark>/<label>.json. They are kept where they are because the
README and docs cite them; this index says, per file, what can still be known about it:

- `added` / `last_changed`: the commits (and their dates) that added the file and last
  changed it (`git log`), `sha256` of the file as it is now;
- `script`: the producing script, from the file's own words (a `*.py` named in its `what`
  or `commands`) or else its name (`agentic_*_pooled` -> agentic_pool.py, `agentic_*` ->
  agentic_pipeline.py, `<script>[_-]*` -> <script>.py); `script_exists`; `producer`
  says "rldojo CLI" for files assembled from the commands they list;
- `keys_not_written`: top-level keys the script's source (with the library modules it
  writes through, `WRITES_THROUGH`) never names (no version of it in git history:
  `git log -S`), so someone added them by hand; `keys_of_older_script`:
  keys an earlier version of the script wrote and today's does not; `hand_edited`: true
  when there are keys no version wrote, or no script at all.

A re-run of a benchmark writes to the new layout; the flat file can then be retired.
tests/benchmarks/test_provenance.py regenerates this index and compares.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
INDEX = RESULTS / "LEGACY.json"
# Where results are cited; a flat file none of these names can be retired.
CITING = ("README.md", "docs/**/*.md", "benchmarks/README.md")
SCRIPT_WORDS = re.compile(r"[\w./-]+\.py\b")
# The library modules a script writes its results through: their strings are keys it writes.
WRITES_THROUGH = {
    "benchmarks/agentic_pipeline.py": (
        "src/rldojo/training/pipeline.py",
        "src/rldojo/eval/compare.py",
    ),
    "benchmarks/agentic_pool.py": ("src/rldojo/eval/compare.py",),
}


def git(*args: str, root: Path = REPO) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()


def flat_files(results: Path = RESULTS) -> list[Path]:
    """The legacy result files: JSON directly under results/, the index itself excepted."""
    return sorted(p for p in results.glob("*.json") if p.name != INDEX.name)


def _commit(line: str) -> dict[str, str] | None:
    if not line:
        return None
    commit, _, date = line.partition(" ")
    return {"commit": commit, "date": date}


def history(path: Path, root: Path = REPO) -> tuple[dict | None, dict | None]:
    """(the commit that added `path`, the commit that last changed it); None when untracked."""
    rel = str(path.relative_to(root))
    log = git("log", "--format=%H %cs", "--", rel, root=root).splitlines()
    return (_commit(log[-1]), _commit(log[0])) if log else (None, None)


def _named_script(doc: dict[str, Any]) -> str | bool | None:
    """A script the file's `what`/`commands` name; False when they list only rldojo CLI
    commands; None when they say nothing."""
    words = json.dumps([doc.get("what"), doc.get("commands")])
    named = SCRIPT_WORDS.findall(words)
    if named:
        return named[0]
    return False if re.search(r"\brldojo (eval|sft|train|demos)\b", words) else None


@functools.cache
def known_scripts(root: Path) -> set[str]:
    """Stems of the scripts in benchmarks/ now or in any commit: a deleted script is still
    named as a file's producer, and recorded as missing."""
    added = git("log", "--format=", "--name-only", "--diff-filter=A", "--", "benchmarks/*.py",
                root=root).split()  # fmt: skip
    now = (p.relative_to(root) for p in (root / "benchmarks").glob("*.py"))
    return {Path(name).stem for name in [*added, *map(str, now)] if name.count("/") == 1}


def producing_script(path: Path, doc: dict[str, Any], benchmarks: Path = BENCHMARKS) -> Any:
    """(script path relative to the repo or None, producer words): see the module docstring."""
    named = _named_script(doc)
    if named is False:
        return None, "rldojo CLI (the commands are in the file)"
    if isinstance(named, str):
        local = benchmarks / Path(named).name
        return (f"benchmarks/{local.name}" if local.exists() else named), "script"
    stem = path.stem
    if stem.startswith("agentic_"):
        name = "agentic_pool" if stem.endswith("_pooled") else "agentic_pipeline"
        return f"benchmarks/{name}.py", "script"
    for script in sorted(known_scripts(benchmarks.parent), key=len, reverse=True):
        if stem == script or stem.startswith((f"{script}_", f"{script}-")):
            return f"benchmarks/{script}.py", "script"
    return None, "unknown"


def source_strings(script: Path) -> set[str]:
    """Every string constant in a script: the keys it can write."""
    nodes = ast.walk(ast.parse(script.read_text()))
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@functools.cache
def _ever_named(script: str, key: str, root: Path) -> bool:
    # -S finds the commits that changed how often the string occurs: one exists when any
    # version of the script held it.
    return bool(git("log", "--format=%H", "-S", f'"{key}"', "--", script, root=root))


def entry(path: Path, root: Path = REPO) -> dict[str, Any]:
    """The index entry of one flat file."""
    doc = json.loads(path.read_text())
    added, changed = history(path, root)
    script, producer = producing_script(path, doc, root / "benchmarks")
    exists = script is not None and (root / script).is_file()
    row: dict[str, Any] = {
        "added": added, "last_changed": changed,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "script": script, "script_exists": exists, "producer": producer,
        "has_manifest": "manifest" in doc,
    }  # fmt: skip
    if exists:
        through = [root / m for m in WRITES_THROUGH.get(script, ()) if (root / m).is_file()]
        known = source_strings(root / script).union(*map(source_strings, through))
        extra = [k for k in doc if k not in known]
        older = [k for k in extra if _ever_named(script, k, root)]
        row["keys_not_written"] = [k for k in extra if k not in older]
        row["keys_of_older_script"] = older
    row["hand_edited"] = not exists or bool(row.get("keys_not_written"))
    return row


def build(root: Path = REPO) -> dict[str, Any]:
    """The whole index: one entry per flat file under `root`/benchmarks/results."""
    files = flat_files(root / "benchmarks" / "results")
    return {
        "about": "Provenance of the flat result files that predate results_io; generated "
        "by benchmarks/legacy_index.py from git history (see its docstring).",
        "files": {p.name: entry(p, root) for p in files},
    }


def render(index: dict[str, Any]) -> str:
    return json.dumps(index, indent=1, sort_keys=False) + "\n"


def cited_text(root: Path = REPO) -> str:
    """README.md, docs/**/*.md and benchmarks/README.md, concatenated."""
    return "\n".join(p.read_text() for pattern in CITING for p in sorted(root.glob(pattern)))


def uncited(root: Path = REPO) -> list[str]:
    """Flat files whose name no README or doc mentions: the ones that can be retired."""
    text = cited_text(root)
    return [p.name for p in flat_files(root / "benchmarks" / "results") if p.name not in text]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when LEGACY.json is stale")
    parser.add_argument("--uncited", action="store_true", help="list the files nothing cites")
    args = parser.parse_args()
    if args.uncited:
        print("\n".join(uncited()))
        return
    text = render(build())
    if args.check:
        if not INDEX.exists() or INDEX.read_text() != text:
            sys.exit(f"{INDEX} is stale: run python benchmarks/legacy_index.py")
        print(f"{INDEX} is current")
        return
    INDEX.write_text(text)
    print(f"wrote {INDEX}")


if __name__ == "__main__":
    main()
