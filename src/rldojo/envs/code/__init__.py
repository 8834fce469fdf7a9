"""code-v1 and code-repair-v1: write Python, rewarded by tests run in the sandbox.

``code-v1`` asks for a function (or a stdin/stdout program) and grades the completion
once; ``code-repair-v1`` runs each attempt against the task's visible tests and replies
with what failed until they pass or the turns run out.

    env = make_env("code-repair-v1", source="humaneval", max_turns=3)
    task = env.tasks("test", seed=0, n=1)[0]

Modules: `env` (`CodeEnv`, `CodeRepairEnv`, `TurnCostGrader`), `tasks` (`CodeTaskSource`:
procedural, HumanEval and JSONL tasks, splits), `templates` (the procedural function
templates) and `feedback` (visible-test runs and feedback messages).
"""

from rldojo.envs.code.env import ENV_ID, REPAIR_ENV_ID, CodeEnv, CodeRepairEnv, TurnCostGrader
from rldojo.envs.code.tasks import CodeTaskSource
from rldojo.envs.registry import register

__all__ = ["CodeEnv", "CodeRepairEnv", "CodeTaskSource", "TurnCostGrader"]

register(ENV_ID, CodeEnv)
register(REPAIR_ENV_ID, CodeRepairEnv)
