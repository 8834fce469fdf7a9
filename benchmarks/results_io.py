"""Where a benchmark writes its result, and the manifest that makes every figure traceable.

Every script in benchmarks/ writes through `write_result`:

    benchmarks/results/<benchmark>/<label>.json = {"manifest": {...}, **values}

The manifest records what produced the numbers: the git commit and whether the tree was
dirty, taken when the script started (and again when it writes, if a commit came
between), the exact command line (interpreter first), the producing script's path in the
repository, the machine (CPU model, vector flags, cores, GPU), the python / torch /
transformers versions, the seed, the UTC date and the wall time. `MANIFEST_KEYS` is the
contract that tests/benchmarks/test_provenance.py checks on every committed result.

The folder is, in order: `out_dir` (the scripts' `--results DIR`), `$RLDOJO_RESULTS_DIR`,
benchmarks/results/. A dry run (`--dry`) never writes into benchmarks/results/: without a
folder it gets a fresh temporary one, and a folder inside benchmarks/results/ is refused.
Scripts import this module as `results_io` (run as `python benchmarks/x.py`, benchmarks/
is on sys.path).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
REPO = BENCHMARKS.parent
ENV_VAR = "RLDOJO_RESULTS_DIR"
# The flags that decide which precision and kernels are fast on a CPU.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
MANIFEST_KEYS = (
    "benchmark", "label", "script", "command", "git", "machine", "versions", "seed",
    "dry", "date", "started", "wall_s",
)  # fmt: skip
# Defaults to when the script imported this module: close enough to its start.
STARTED = time.time()


def add_result_args(parser: argparse.ArgumentParser, dry_help: str) -> None:
    """Adds `--results DIR` and `--dry` (what the dry mode shrinks goes in `dry_help`)."""
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"folder of the results (default: ${ENV_VAR}, else benchmarks/results; "
        "with --dry a new temporary folder)",
    )
    parser.add_argument("--dry", action="store_true", help=dry_help)


def results_dir(out_dir: Path | str | None = None, *, dry: bool = False) -> Path:
    """The folder results go to; a dry run gets a temporary one and never benchmarks/results."""
    chosen = out_dir or os.environ.get(ENV_VAR)
    if chosen is None:
        chosen = tempfile.mkdtemp(prefix="bench_dry_") if dry else RESULTS
    folder = Path(chosen).resolve()
    if dry and (folder == RESULTS or RESULTS in folder.parents):
        raise SystemExit(f"a dry run writes outside {RESULTS}: got {folder}")
    return folder


def result_path(
    benchmark: str, label: str, out_dir: Path | str | None = None, *, dry: bool = False
) -> Path:
    """`<folder>/<benchmark>/<label>.json`; see `results_dir` for the folder."""
    return results_dir(out_dir, dry=dry) / benchmark / f"{label}.json"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              text=True, timeout=30, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state() -> dict[str, Any]:
    """The commit checked out and whether tracked or untracked files differ from it."""
    status = _git("status", "--porcelain", "--untracked-files=normal")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


# The code that ran is the checkout at the start; a commit made while a long benchmark
# runs is recorded beside it (`at_write`), not in its place.
GIT_AT_START = git_state()


def _cpu_info() -> tuple[str | None, list[str]]:
    model: str | None = None
    flags: list[str] = []
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or None, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = sorted(set(value.split()) & set(CPU_FLAGS))
    return model, flags


def _gpu_name() -> str | None:
    # Only a script that already imported torch can have used a GPU through it; importing
    # torch here would cost seconds in the scripts that never touch a model.
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    except Exception:  # a broken driver: the result is still worth writing
        return None


def machine() -> dict[str, Any]:
    """The CPU model, its relevant vector flags, the cores, and the GPU when torch sees one."""
    model, flags = _cpu_info()
    return {
        "cpu_model": model,
        "cpu_flags": flags,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "gpu": _gpu_name(),
        "platform": platform.platform(),
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _script() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if REPO in resolved.parents else str(resolved)


def manifest(
    benchmark: str,
    label: str,
    *,
    seed: int | None,
    started: float,
    dry: bool,
    script: str | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """What produced a result; the keys are `MANIFEST_KEYS`. `script` and `command` default
    to this process's; a shell script that writes through Python passes its own."""
    now = time.time()
    return {
        "benchmark": benchmark,
        "label": label,
        "script": script or _script(),
        "command": command or [sys.executable, *sys.argv],
        "git": _git_record(),
        "machine": machine(),
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "rldojo": _version("rldojo"),
        },
        "seed": seed,
        "dry": dry,
        "date": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="seconds"),
        "started": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "wall_s": round(now - started, 3),
    }


def _git_record() -> dict[str, Any]:
    """The checkout the process started from; what it is now too, when that differs."""
    now = git_state()
    return dict(GIT_AT_START) if now == GIT_AT_START else {**GIT_AT_START, "at_write": now}


def write_result(
    benchmark: str,
    label: str,
    values: dict[str, Any],
    *,
    out_dir: Path | str | None = None,
    path: Path | str | None = None,
    seed: int | None = None,
    started: float = STARTED,
    dry: bool = False,
    script: str | None = None,
    command: list[str] | None = None,
) -> Path:
    """Writes `{"manifest": ..., **values}` to `<folder>/<benchmark>/<label>.json`.

    `path` names the file itself instead (scripts whose `--out FILE` other scripts pass,
    e.g. gpu_check.sh); a dry run refuses one inside benchmarks/results/ all the same.
    Returns the file written.
    """
    if "manifest" in values:
        raise ValueError("'manifest' is the helper's key; rename the value")
    if path is None:
        target = result_path(benchmark, label, out_dir, dry=dry)
    else:
        target = results_dir(Path(path).parent, dry=dry) / Path(path).name
    made = manifest(benchmark, label, seed=seed, started=started, dry=dry, script=script,
                    command=command)  # fmt: skip
    doc = {"manifest": made, **values}
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written whole then renamed: a reader (or a killed run) never sees half a file.
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.replace(target)
    return target


def is_complete(doc: dict[str, Any]) -> list[str]:
    """The manifest keys a result lacks (or leaves empty where a value is always known)."""
    found = doc.get("manifest")
    if not isinstance(found, dict):
        return ["manifest"]
    missing = [k for k in MANIFEST_KEYS if k not in found]
    required = {"script": found.get("script"), "command": found.get("command"),
                "date": found.get("date"), "wall_s": found.get("wall_s"),
                "git.commit": (found.get("git") or {}).get("commit"),
                "machine.cpu_model": (found.get("machine") or {}).get("cpu_model"),
                "versions.python": (found.get("versions") or {}).get("python")}  # fmt: skip
    return missing + [k for k, v in required.items() if k.split(".")[0] in found and v is None]
