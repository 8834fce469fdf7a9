"""The public Python API: train, fine-tune, distil and evaluate from a script or a notebook.

`rldojo.train`, `rldojo.sft` and `rldojo.distill` run what the CLI commands run and return
a `RunResult` (`rldojo.api.runs`); `rldojo.evaluate` scores a model or a run directory's
newest checkpoint on an environment's tasks (`rldojo.api.evaluation`). A reward function
and a list of rows are enough to train (`rldojo.envs.function_reward`). The `rldojo`
package re-exports these lazily, so `import rldojo` imports no torch. docs/api.md is the
user's page.
"""

from rldojo.api.evaluation import evaluate
from rldojo.api.runs import RunResult, as_config, distill, sft, train

__all__ = ["RunResult", "as_config", "distill", "evaluate", "sft", "train"]
