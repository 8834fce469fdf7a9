"""rldojo.workers: long-lived worker processes with per-call timeouts, kill and replace.

The bottom layer under code that must not take the trainer down with it (only stdlib):

- `pool`: `WorkerPool`, `size` workers replaced when they die;
- `process`: `WorkerProcess`, one worker: calls with timeouts, kills, and whose call a
  death is blamed on;
- `deadlines`: how a call's timeout is enforced (its clock runs while the worker runs it);
- `outcomes`: the errors a call can end in, and the counters of a pool;
- `child`: the worker's own main loop, in a fresh interpreter;
- `spawn`: how that interpreter is started (its environment, and where its output goes).

Its users: grader isolation (`rldojo.workers.isolation`: one call per worker at a time,
math-verify and user graders) and environment workers (`rldojo.rollout.env_pool`:
many async episodes per worker, replayed when their worker dies).
"""

from rldojo.workers.outcomes import (
    CallError,
    CallTimeout,
    Counters,
    WorkerDied,
    WorkerStartTimeout,
    describe_exit,
)
from rldojo.workers.pool import WorkerPool
from rldojo.workers.process import WorkerProcess

__all__ = [
    "CallError",
    "CallTimeout",
    "Counters",
    "WorkerDied",
    "WorkerPool",
    "WorkerProcess",
    "WorkerStartTimeout",
    "describe_exit",
]
