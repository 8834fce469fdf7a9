"""rldojo.graders: turn a finished rollout into a `Score`.

- `base`: the `Grader` protocol.
- `rules`: answer extraction, exact match, math-verify (isolated), the format term.
- `composite`: weighted sums of sub-graders and the standard answer reward.
- `isolation`: hard-timeout worker processes for graders that may hang or crash.

Importing this package is cheap: math-verify is only imported inside worker processes.
"""

from rldojo.graders.base import Grader
from rldojo.graders.composite import FORMAT_PENALTY, CompositeGrader, answer_reward
from rldojo.graders.isolation import (
    IsolatedPool,
    IsolatedWorker,
    IsolationCrash,
    IsolationError,
    IsolationTimeout,
    RemoteError,
)
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

__all__ = [
    "ANSWER_PREFIX",
    "FORMAT_PENALTY",
    "CompositeGrader",
    "ExactMatchGrader",
    "FormatGrader",
    "Grader",
    "IsolatedPool",
    "IsolatedWorker",
    "IsolationCrash",
    "IsolationError",
    "IsolationTimeout",
    "MathVerifyGrader",
    "RemoteError",
    "answer_instruction",
    "answer_reward",
    "extract_answer",
    "has_answer_line",
    "last_boxed",
    "math_verify_pool",
    "normalize_answer",
]
