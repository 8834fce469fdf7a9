"""What the machine can do, measured: the precision to compute in (`precision`) and how
many threads each part of a run gets (`threads`). Depends on torch only; the trainer,
the policies, the server and `rldojo doctor` read it."""

from rldojo.hardware.precision import Precision, resolve_precision
from rldojo.hardware.threads import ThreadPlan, apply_thread_plan, plan_threads, usable_cores

__all__ = [
    "Precision",
    "ThreadPlan",
    "apply_thread_plan",
    "plan_threads",
    "resolve_precision",
    "usable_cores",
]
