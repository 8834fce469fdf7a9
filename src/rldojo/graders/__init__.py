"""rldojo.graders: turn a finished rollout into a `Score`.

- `base`: the `Grader` protocol.
- `rules`: answer extraction, exact match, math-verify (isolated), the format term.
- `composite`: weighted sums of sub-graders and the standard answer reward.
- `isolation`: hard-timeout worker processes for graders that may hang or crash.
- `loading`: `load(spec)`, OpenAI grader specs and rldojo TOML specs (`openai_spec`,
  `openai_model_graders`, `openai_python`, `rldojo_spec`, `openai_templates`).
- `judge`, `judge_cache`: judge backends (OpenAI-compatible HTTP, in-process
  transformers), retries, concurrency, the SQLite reply cache, provenance.
- `rubric`, `group_judge`: LLM-judge graders (signed-points rubrics; whole-group scoring).
- `injection`: fencing, strict verdicts and the ``hack:judge_injection`` detector.
- `text_metrics`, `safe_expr`: similarity metrics and the `calculate_output` evaluator.
- `token_rewards`: per-token rewards on spans of the completion.
- `meta_eval`, `offline`: judge agreement and bias probes; grading a JSONL file.

Importing this package is cheap: math-verify is only imported inside worker processes.
"""

from rldojo.graders.base import Grader
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader, answer_reward
from rldojo.graders.group_judge import GroupJudgeGrader
from rldojo.graders.injection import INJECTION_FLAG, detect_injection
from rldojo.graders.isolation import (
    IsolatedWorker,
    IsolationCrash,
    IsolationError,
    IsolationTimeout,
    RemoteError,
)
from rldojo.graders.isolation_pool import IsolatedPool
from rldojo.graders.judge import (
    EngineJudge,
    JudgeClient,
    JudgeError,
    JudgeRequest,
    JudgeStats,
    JudgeTimeout,
    OpenAIJudge,
)
from rldojo.graders.judge_cache import JudgeCache
from rldojo.graders.loading import (
    GraderSpecError,
    LoadContext,
    SpecGrader,
    load,
    register_grader_type,
)
from rldojo.graders.rubric import TRACE_CRITERIA, Criterion, RubricGrader
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
from rldojo.graders.token_rewards import SpanPenaltyGrader, spans_to_token_rewards

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
