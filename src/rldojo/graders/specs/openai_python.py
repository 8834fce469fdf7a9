"""OpenAI's `python` grader type: ``def grade(sample, item) -> float``, run in the sandbox.

    {"type": "python", "name": "numeric", "source": "def grade(sample, item):\\n    ..."}

The source is checked at load time by parsing it (never executing it here): it must
define a top-level ``grade`` taking two arguments. At grade time a small trusted driver
runs in `rldojo.sandbox` (bubblewrap, rlimits, seccomp; see that package) with the source
and the JSON of `sample` and `item` as files, calls ``grade`` and prints the result on a
marker line. Nothing of the grader runs in our process.

Outcomes: a finite number in `score_range` -> `ok` with that value; ``grade`` raised or
the result is not a number -> `error` / `invalid` with the sandbox's last line of stderr;
a number outside `score_range` -> `invalid`; wall-clock limit -> `timeout`; memory or
sandbox failure -> `error`. Never a reward of 0.

`score_range` (an rldojo extension key, default ``[0, 1]`` as OpenAI's graders return)
is the closed interval a result must lie in; a grader meant to return, say, -1..1 says
``"score_range": [-1, 1]``. While ``grade`` runs, its `print` output goes to stderr, so
printing does not push the result out of the captured stdout; a grader that floods
stdout at the file-descriptor level is told so, not given a bare exit code.

The sandbox runs the system Python: packages OpenAI's grader image ships (numpy, scipy,
sympy, ...) are available only if that interpreter has them. `image_tag` is accepted and
recorded, not used. The item (which may hold the reference answer) is visible to the
grader inside the sandbox, as in OpenAI's service; the model's output is passed as data.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rldojo import pyast
from rldojo.graders.base import Grader
from rldojo.graders.openai_templates import item_view, sample_view
from rldojo.graders.specs.common import GraderSpecError, check_keys, require
from rldojo.graders.specs.context import LoadContext
from rldojo.types import Rollout, Score, Task

if TYPE_CHECKING:
    from rldojo.sandbox.spec import ExecResult

__all__ = ["DRIVER", "PythonGrader", "build_python", "check_source"]

MARKER = "__rldojo_python_grader_result__"
MAX_SOURCE_BYTES = 256 * 1024

DRIVER = f"""
import json, math, sys
with open("input.json") as f:
    data = json.load(f)
namespace = {{"__name__": "grader"}}
with open("grader.py") as f:
    exec(compile(f.read(), "grader.py", "exec"), namespace)
stdout, sys.stdout = sys.stdout, sys.stderr
try:
    result = namespace["grade"](data["sample"], data["item"])
finally:
    sys.stdout = stdout
try:
    value = float(result)
except (TypeError, ValueError):
    print("\\n{MARKER}" + json.dumps({{"bad": repr(result)[:200]}}))
    sys.exit(0)
print("\\n{MARKER}" + json.dumps({{"value": value if math.isfinite(value) else None,
                                 "raw": repr(value)}}))
"""
"""The trusted driver run inside the sandbox (the grader's source is a separate file)."""


def check_source(source: str, path: str) -> None:
    """GraderSpecError unless `source` parses and defines a top-level ``grade(sample, item)``."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise GraderSpecError(f"{path}.source: larger than {MAX_SOURCE_BYTES // 1024} KiB")
    try:
        tree = pyast.parse(source, filename="grader.py")
    except SyntaxError as exc:
        raise GraderSpecError(f"{path}.source: line {exc.lineno}: {exc.msg}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "grade":
            args = node.args
            positional = len(args.posonlyargs) + len(args.args)
            if positional >= 2 or args.vararg is not None:
                return
            raise GraderSpecError(f"{path}.source: grade() must take (sample, item)")
    raise GraderSpecError(f"{path}.source: no top-level `def grade(sample, item)`")


class PythonGrader:
    """`python`: the user's ``grade(sample, item)`` in the sandbox (module docstring)."""

    type = "python"

    def __init__(
        self,
        name: str,
        source: str,
        *,
        timeout_s: float = 10.0,
        memory_mb: int = 512,
        image_tag: str | None = None,
        pass_threshold: float | None = None,
        score_range: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        self.name, self.source = name, source
        self.score_range = score_range
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.image_tag = image_tag
        if pass_threshold is not None:
            self.pass_threshold = pass_threshold

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        from rldojo import sandbox

        provenance: dict[str, Any] = {
            "grader": self.name,
            "type": self.type,
            "sandbox": "rldojo.sandbox",
            "image_tag": self.image_tag,
        }
        payload = json.dumps({"sample": sample_view(rollout), "item": item_view(task)}, default=str)
        try:
            result = await sandbox.run_async(
                DRIVER,
                files={"grader.py": self.source, "input.json": payload},
                timeout_s=self.timeout_s,
                memory_mb=self.memory_mb,
            )
        except Exception as exc:  # sandbox unavailable or broken: an error, never a 0
            return Score.failed(
                "error", f"sandbox: {type(exc).__name__}: {exc}", provenance=provenance
            )
        provenance["wall_s"] = round(result.wall_s, 3)
        return self._outcome(result, provenance)

    def _outcome(self, result: ExecResult, provenance: dict[str, Any]) -> Score:
        if result.status == "timeout":
            why = f"grade() ran past {self.timeout_s:g}s"
            return Score.failed("timeout", why, provenance=provenance)
        if result.status != "ok":
            why = f"sandbox status {result.status}: {_last_line(result.stderr) or result.status}"
            return Score.failed("error", why, provenance=provenance)
        line = next(
            (ln for ln in reversed(result.stdout.splitlines()) if ln.startswith(MARKER)), None
        )
        if result.returncode != 0 or line is None:
            why = f"grade() failed: {_last_line(result.stderr) or f'exit code {result.returncode}'}"
            if result.stdout_truncated or result.stderr_truncated:
                cap = len(result.stdout) if result.stdout_truncated else len(result.stderr)
                why = (
                    f"grade() wrote more output than the sandbox keeps ({cap // 1024} KiB) "
                    "and its result was lost; print less"
                    + ("" if result.returncode == 0 else f" (exit code {result.returncode})")
                )
            return Score.failed("error", why, provenance=provenance)
        reply = json.loads(line[len(MARKER) :])
        if "bad" in reply:
            why = f"grade() returned {reply['bad']}, not a number"
            return Score.failed("invalid", why, provenance=provenance)
        value = reply.get("value")
        if value is None or not math.isfinite(value):
            why = f"grade() returned {reply.get('raw')}, not a finite number"
            return Score.failed("invalid", why, provenance=provenance)
        low, high = self.score_range
        if not low <= value <= high:
            why = (
                f"grade() returned {value:g}, outside score_range [{low:g}, {high:g}] "
                "(declare another range with score_range)"
            )
            return Score.failed("invalid", why, provenance=provenance)
        return Score(float(value), provenance=provenance)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def build_python(spec: Mapping[str, Any], ctx: LoadContext, path: str) -> Grader:
    check_keys(
        spec,
        (
            *("type", "name", "source", "image_tag", "pass_threshold"),
            *("timeout_s", "memory_mb", "score_range"),
        ),
        path,
    )
    source = require(spec, "source", str, path)
    check_source(source, path)
    threshold = spec.get("pass_threshold")
    score_range = _score_range(spec.get("score_range", [0.0, 1.0]), f"{path}.score_range")
    return PythonGrader(
        str(spec.get("name", path.rsplit(".", 1)[-1])),
        source,
        timeout_s=float(require(spec, "timeout_s", (int, float), path))
        if "timeout_s" in spec
        else 10.0,
        memory_mb=int(require(spec, "memory_mb", int, path)) if "memory_mb" in spec else 512,
        image_tag=spec.get("image_tag"),
        pass_threshold=float(threshold) if threshold is not None else None,
        score_range=score_range,
    )


def _score_range(value: object, path: str) -> tuple[float, float]:
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        and all(math.isfinite(v) for v in value)
        and value[0] < value[1]
    ):
        return float(value[0]), float(value[1])
    raise GraderSpecError(f"{path}: expected [low, high] with low < high, got {value!r}")
