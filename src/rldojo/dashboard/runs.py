"""Run directories as the dashboard reads them: found under the served roots, read without
writing, and read while a run is still writing them.

A run directory (the layout `rldojo train` writes, see `rldojo.training.loop`) is any
directory under a root that holds `metrics.jsonl`, `ledger.sqlite` or `summary.json`.
Its id is its path relative to its root, prefixed by the root's index when several roots
are served (`0/tiny1`, `1/exp/a`). A path that resolves outside every root is not a run,
whatever `..` or symlinks it holds.

A run's status says how it ended, as its `summary.json` records it (`stopped`, written
by `rldojo.training.loop`): `finished` (the step count, `run.max_minutes` or a callback
ended it), `interrupted` (SIGINT/SIGTERM; `--resume` continues it) or `failed` (the
failure budget). Without a summary, or with one older than the run's latest (re)start, it
is `running` while its files change and `stopped` (killed or crashed) after.

Reading tolerates a run being written: a metrics line that is not (yet) whole JSON is
skipped and counted (`bad_lines`), a missing file is an empty value, never an error.
"""

from __future__ import annotations

import json
import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_MARKERS = ("metrics.jsonl", "ledger.sqlite", "summary.json")
"""A directory holding any of these files is a run."""

LIVE_S = 120.0
"""A run without a current `summary.json` whose files changed within this many seconds is
`running`; older, it is `stopped` (killed or crashed; `rldojo train --resume` continues it)."""

ENDED = {"steps": "finished", "max_minutes": "finished", "callback": "finished",
         "interrupted": "interrupted", "failures": "failed", "error": "failed"}  # fmt: skip
"""A run's status by its summary's `stopped` (`rldojo.training.loop`, `training.stops`);
a summary without `stopped` (or with a value not listed) reads `finished`."""

STARTS = "config_history.jsonl"
"""Appended at each start and resume: a summary older than it is an earlier attempt's."""

MAX_DEPTH = 4
"""How deep below a root run directories are looked for."""


@dataclass
class Metrics:
    """A run's `metrics.jsonl`: train records and eval records, in file order."""

    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf; the log may (Python's json writes them): those become null."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }


def read_metrics(path: Path) -> Metrics:
    """Parse `metrics.jsonl`; a line being written or cut short is skipped and counted.
    A step logged twice (a resumed run redoes the steps after its checkpoint) keeps its
    last record."""
    out = Metrics()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    train: dict[int, dict[str, Any]] = {}
    evals: dict[tuple[int, str], dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            out.bad_lines += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            out.bad_lines += 1
            continue
        record = _finite(record)
        if record.get("kind", "train") == "eval":
            evals[(record["step"], str(sorted(record)))] = record
        else:
            train[record["step"]] = record
    out.train = [train[s] for s in sorted(train)]
    out.evals = sorted(evals.values(), key=lambda r: r["step"])
    return out


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class Run:
    """One run directory."""

    id: str
    path: Path

    def file(self, name: str) -> Path:
        return self.path / name

    def summary(self) -> dict[str, Any] | None:
        """`summary.json`, written when the run ended (None before, or if unreadable)."""
        return _read_json(self.file("summary.json"))

    def ended(self) -> bool:
        """True when `summary.json` was written after the run's latest start (a resumed
        run keeps its earlier attempt's summary until it ends again)."""
        try:
            written = self.file("summary.json").stat().st_mtime
        except OSError:
            return False
        try:
            return written >= self.file(STARTS).stat().st_mtime
        except OSError:  # no start recorded: the summary is the run's
            return True

    def config(self) -> tuple[str, dict[str, Any]]:
        """The resolved config as written (`config.toml`): its text and parsed form."""
        try:
            text = self.file("config.toml").read_text(encoding="utf-8")
        except OSError:
            return "", {}
        try:
            return text, tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return text, {}

    def status(self, now: float | None = None, summary: dict[str, Any] | None = None) -> str:
        """How the run ended, by its summary's `stopped` (`ENDED`: `finished`,
        `interrupted`, `failed`); before it has ended, `running` (files changed within
        `LIVE_S`) or `stopped`. `summary`: the one the caller read (else read here)."""
        if self.ended():
            summary = self.summary() if summary is None else summary
            return ENDED.get(str((summary or {}).get("stopped")), "finished")
        now = time.time() if now is None else now
        changed = max((p.stat().st_mtime for p in self._markers()), default=0.0)
        return "running" if now - changed < LIVE_S else "stopped"

    def _markers(self) -> list[Path]:
        names = [*RUN_MARKERS, "ledger.sqlite-wal", STARTS]
        return [p for p in (self.file(n) for n in names) if p.exists()]

    def checkpoints(self) -> list[dict[str, Any]]:
        """`checkpoints/step_N` directories, oldest first, with their step."""
        root = self.file("checkpoints")
        if not root.is_dir():
            return []
        out = []
        for d in sorted(root.iterdir()):
            if d.is_dir() and d.name.startswith("step_") and d.name[5:].isdigit():
                out.append({"step": int(d.name[5:]), "path": str(d)})
        return out

    def row(
        self,
        metrics: Metrics | None = None,
        config: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The runs table's row: status and what stopped it (the summary's `stopped`, None
        before the run ended), envs, model, steps, last reward, held-out accuracy
        before/after, wall time (from the files, or from what the caller read)."""
        config = self.config()[1] if config is None else config
        summary = (self.summary() if summary is None else summary) or {}
        if not self.ended():  # an earlier attempt's, or none
            summary = {}
        metrics = read_metrics(self.file("metrics.jsonl")) if metrics is None else metrics
        env = config.get("env", {})
        envs = [env.get("id")] if env.get("id") else []
        envs += [m.get("id") for m in env.get("mix", []) if isinstance(m, dict) and m.get("id")]
        last = metrics.train[-1] if metrics.train else {}
        accs = [e.get("eval/accuracy") for e in metrics.evals if "eval/accuracy" in e]
        wall = summary.get("wall_s")
        if wall is None:
            wall = sum(float(r.get("time/step") or 0.0) for r in metrics.train)
        return {
            "id": self.id,
            "status": self.status(summary=summary),
            "stopped_by": summary.get("stopped"),
            "model": config.get("model", {}).get("name") or summary.get("model"),
            "envs": envs or ([summary["env"]] if summary.get("env") else []),
            "steps": last.get("step", 0),
            "planned_steps": config.get("run", {}).get("steps"),
            "reward": last.get("reward/mean"),
            "pass_rate": last.get("reward/pass_rate"),
            "accuracy_before": summary.get("accuracy_before", accs[0] if accs else None),
            "accuracy_after": summary.get("accuracy_after", accs[-1] if len(accs) > 1 else None),
            "wall_s": wall,
            "modified": max((p.stat().st_mtime for p in self._markers()), default=None),
            "bad_lines": metrics.bad_lines,
        }


class RunIndex:
    """The runs under the served roots."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = [Path(r).resolve() for r in roots]

    def _id(self, index: int, rel: Path) -> str:
        name = rel.as_posix()
        return name if len(self.roots) == 1 else f"{index}/{name}"

    def runs(self) -> list[Run]:
        """Every run directory under the roots (a root may itself be a run)."""
        found: list[Run] = []
        for index, root in enumerate(self.roots):
            todo = [(root, 0)]
            while todo:
                here, depth = todo.pop()
                try:
                    names = {p.name: p for p in here.iterdir()}
                except OSError:
                    continue
                if any(m in names for m in RUN_MARKERS):
                    found.append(Run(self._id(index, here.relative_to(root)), here))
                    continue
                if depth < MAX_DEPTH:
                    todo += [(p, depth + 1) for p in names.values() if _is_dir(p, root)]
        return sorted(found, key=lambda r: r.id)

    def get(self, run_id: str) -> Run | None:
        """The run with this id, or None: unknown, or a path outside the roots."""
        if len(self.roots) == 1:
            index, rel = 0, run_id
        else:
            head, _, rel = run_id.partition("/")
            if not head.isdigit() or int(head) >= len(self.roots):
                return None
            index = int(head)
        root = self.roots[index]
        path = (root / rel).resolve()
        if not path.is_relative_to(root) or not path.is_dir():
            return None
        if not any((path / m).exists() for m in RUN_MARKERS):
            return None
        return Run(self._id(index, path.relative_to(root)), path)


def _is_dir(path: Path, root: Path) -> bool:
    """A directory to look into: not hidden, and not a symlink out of the root."""
    try:
        return (
            path.is_dir() and not path.name.startswith(".") and path.resolve().is_relative_to(root)
        )
    except OSError:
        return False
