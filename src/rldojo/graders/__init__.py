"""rldojo.graders: turn a finished rollout into a `Score`.

Top-level modules (rules and shared pieces; at run time they import nothing from the
subpackages):

- `base`: the `Grader` protocol.
- `rules`: answer extraction, exact match, math-verify (isolated), the format term.
- `composite`: weighted sums of sub-graders and the standard answer reward.
- `isolation`, `isolation_pool`: hard-timeout worker processes for graders that may hang
  or crash.
- `text_metrics`, `safe_expr`: similarity metrics and the `calculate_output` evaluator.
- `token_rewards`: per-token rewards on spans of the completion.
- `openai_templates`, `template_check`: ``{{item.x}}`` / ``{{sample.x}}`` templates and
  checking them against data up front.
- `offline`: grading a JSONL file of samples.

Subpackages (dependencies point down: `specs` -> `judges` -> top level; `code` stands
alone):

- `judges`: judge backends (`client`), the reply cache (`cache`), `injection` defences,
  `rubric` and `group` graders, `meta_eval` (judge agreement and bias probes).
- `specs`: `load(spec)` for OpenAI grader specs and rldojo TOML specs (`loading`,
  `context`, `common`, `embedding`, `openai_text`, `openai_models`, `openai_python`,
  `rldojo_types`).
- `code`: code-execution grading in the sandbox (`grader`, `cases`, `scoring`,
  `replay`, `values`, `driver`).

Importing this package is cheap: math-verify is only imported inside worker processes.
"""

from rldojo.graders.base import Grader
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader, answer_reward
from rldojo.graders.judges.cache import JudgeCache
from rldojo.graders.judges.client import (
    EngineJudge,
    JudgeClient,
    JudgeError,
    JudgeRequest,
    JudgeStats,
    JudgeTimeout,
    OpenAIJudge,
)
from rldojo.graders.judges.group import GroupJudgeGrader
from rldojo.graders.judges.injection import INJECTION_FLAG, detect_injection
from rldojo.graders.judges.rubric import TRACE_CRITERIA, Criterion, RubricGrader
from rldojo.graders.rules import (
    ANSWER_PREFIX,
    ExactMatchGrader,
    FormatGrader,
    MathVerifyGrader,
    answer_instruction,
    extract_answer,
    has_answer_line,
    last_boxed,
    math_verify_pool,
    normalize_answer,
)
from rldojo.graders.safe_expr import ExprError, compile_expr
from rldojo.graders.specs.common import GraderSpecError
from rldojo.graders.specs.context import LoadContext, register_grader_type
from rldojo.graders.specs.loading import SpecGrader, load
from rldojo.graders.token_rewards import SpanPenaltyGrader, spans_to_token_rewards
from rldojo.workers.isolation import (
    IsolatedWorker,
    IsolationCrash,
    IsolationError,
    IsolationTimeout,
    RemoteError,
)
from rldojo.workers.isolation_pool import IsolatedPool

__all__ = [
    "ANSWER_PREFIX",
    "FORMAT_PENALTY",
    "INJECTION_FLAG",
    "TRACE_CRITERIA",
    "CompositeGrader",
    "Criterion",
    "EngineJudge",
    "ExactMatchGrader",
    "ExprError",
    "FormatGrader",
    "Grader",
    "GraderSpecError",
    "GroupJudgeGrader",
    "IsolatedPool",
    "IsolatedWorker",
    "IsolationCrash",
    "IsolationError",
    "IsolationTimeout",
    "JudgeCache",
    "JudgeClient",
    "JudgeError",
    "JudgeRequest",
    "JudgeStats",
    "JudgeTimeout",
    "LoadContext",
    "MathVerifyGrader",
    "OpenAIJudge",
    "RemoteError",
    "RubricGrader",
    "SpanPenaltyGrader",
    "SpecGrader",
    "answer_instruction",
    "answer_reward",
    "compile_expr",
    "detect_injection",
    "extract_answer",
    "has_answer_line",
    "last_boxed",
    "load",
    "math_verify_pool",
    "normalize_answer",
    "register_grader_type",
    "spans_to_token_rewards",
]
