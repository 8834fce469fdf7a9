"""Replay grading for assert suites that are not plain input/expected pairs.

Some suites compute their inputs (loops, random strings, helpers from the prompt) or
check properties (``abs(poly(xs, candidate(xs))) < 1e-4``). They are graded in three
sandbox runs, and the candidate's code still never shares a sandbox with the test code:

1. **harvest** (trusted code only, cached per suite): run the suite with ``candidate``
   recording its arguments (and returning the reference solution's result, if any);
   ``random`` is seeded so that inputs repeat.
2. **candidate** (the usual driver run): call the candidate on the harvested inputs.
3. **check** (trusted code only): run the suite again with ``candidate`` replaying the
   candidate's recorded outputs (plain decoded values, no code), every ``assert``
   rewritten to record pass/fail instead of stopping the suite.

The reward is the fraction of assert executions that pass (asserts that never ran
because the suite stopped early count as failed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rldojo.sandbox import ExecResult, ExecSpec, Limits

MARK = "@@rldojo-replay@@"

# Runs in the sandbox (stdlib only). Reads /rldojo/replay.json and the code files.
_REPLAY_PROGRAM = r"""
import ast, json, random, sys
sys.path.insert(0, "/rldojo")
import code_values
cfg = json.load(open("/rldojo/replay.json"))
entry = cfg["entry_point"]

class CandidateFailed(Exception):
    pass

class Hook(ast.NodeTransformer):
    def visit_Assert(self, node):
        fn = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                        kw_defaults=[], defaults=[]), body=node.test)
        call = ast.Call(func=ast.Name("__rldojo_assert__", ast.Load()),
                        args=[fn, ast.Constant(node.lineno)], keywords=[])
        return ast.copy_location(ast.Expr(call), node)

results = []
def record_assert(fn, line):
    try:
        ok = bool(fn())
    except Exception:
        ok = False
    results.append([line, ok])

def key_of(args, kwargs):
    return json.dumps(code_values.encode([list(args), kwargs]), sort_keys=True)

ns = {"__name__": "__replay__", "__rldojo_assert__": record_assert}
exec(compile(open("/rldojo/setup.py").read(), "setup.py", "exec"), ns)
calls, seen = [], set()
if cfg["mode"] == "harvest":
    exec(compile(open("/rldojo/reference.py").read(), "reference.py", "exec"), ns)
    reference = ns.get(entry) if cfg["has_reference"] else None
    def candidate(*args, **kwargs):
        key = key_of(args, kwargs)
        if key not in seen:
            seen.add(key)
            calls.append(code_values.encode([list(args), kwargs]))
        return reference(*args, **kwargs) if reference is not None else None
else:
    table = {k: v for k, v in json.load(open("/rldojo/outputs.json"))}
    def candidate(*args, **kwargs):
        out = table.get(key_of(args, kwargs))
        if out is None or "value" not in out:
            raise CandidateFailed("no value for these inputs")
        value = code_values.decode(out["value"])
        if type(value) is code_values.Unsupported:
            raise CandidateFailed("unsupported value")
        return value
ns[entry] = candidate
tree = ast.fix_missing_locations(Hook().visit(ast.parse(open("/rldojo/test.py").read())))
random.seed(0)
aborted = ""
try:
    exec(compile(tree, "test.py", "exec"), ns)
    if callable(ns.get("check")):
        ns["check"](candidate)
except Exception as exc:
    aborted = type(exc).__name__
sys.stdout.flush()
print(__MARK__ + json.dumps({"calls": calls, "asserts": results, "aborted": aborted}))
""".replace("__MARK__", repr(MARK))


@dataclass(frozen=True)
class ReplaySuite:
    """An assert suite graded by replay; `setup` holds helpers the tests use (a prompt)."""

    test_code: str
    entry_point: str
    setup: str = ""
    reference: str | None = None


@dataclass(frozen=True)
class Harvest:
    calls: tuple[Any, ...]
    """Tagged ``[args, kwargs]`` of every distinct call the suite makes."""
    asserts: int
    """Assert executions in the harvest run (the denominator when grading)."""


class ReplayError(RuntimeError):
    """A trusted replay run failed (the sandbox or the suite itself): a grader error."""


def _code_values_source() -> bytes:
    return resources.files("rldojo.graders.code").joinpath("values.py").read_bytes()


def _spec(suite: ReplaySuite, mode: str, outputs: list[Any] | None, timeout_s: float) -> ExecSpec:
    cfg = {
        "entry_point": suite.entry_point,
        "mode": mode,
        "has_reference": suite.reference is not None,
    }
    files = {
        "main.py": _REPLAY_PROGRAM.encode(),
        "code_values.py": _code_values_source(),
        "replay.json": json.dumps(cfg).encode(),
        "setup.py": suite.setup.encode(),
        "test.py": suite.test_code.encode(),
        "reference.py": (suite.reference or "").encode(),
        "outputs.json": json.dumps(outputs or []).encode(),
    }
    limits = Limits(timeout_s=timeout_s, memory_mb=1024, output_cap=16 << 20, fsize_mb=32)
    return ExecSpec(script=None, limits=limits, ro_files=files)


def _parse(result: ExecResult) -> dict[str, Any]:
    if result.status != "ok":
        raise ReplayError(f"replay run {result.status}: {result.error or result.stderr[-300:]}")
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise ReplayError(f"replay run printed no result: {result.stderr[-300:]}")


def harvest(
    suite: ReplaySuite, execute: Callable[[ExecSpec], ExecResult], timeout_s: float = 30.0
) -> Harvest:
    """Run the suite on trusted code only and record the candidate's inputs."""
    data = _parse(execute(_spec(suite, "harvest", None, timeout_s)))
    if data["aborted"]:
        raise ReplayError(f"suite raised {data['aborted']} while harvesting inputs")
    return Harvest(tuple(data["calls"]), len(data["asserts"]))


def check(
    suite: ReplaySuite,
    harvested: Harvest,
    outcomes: list[dict[str, Any]],
    execute: Callable[[ExecSpec], ExecResult],
    timeout_s: float = 30.0,
) -> tuple[int, int]:
    """(asserts passed, asserts total) when replaying the candidate's `outcomes`.

    `outcomes[i]` is ``{"value": tagged}`` for a call that returned, ``{}`` otherwise.
    """
    table = [
        [json.dumps(call, sort_keys=True), outcome]
        for call, outcome in zip(harvested.calls, outcomes, strict=True)
    ]
    data = _parse(execute(_spec(suite, "check", table, timeout_s)))
    passed = sum(1 for _, ok in data["asserts"] if ok)
    return passed, max(harvested.asserts, len(data["asserts"]))
