"""Reward functions as a grader: TRL's reward functions, per sample or batched, weighted.

    def correct(prompt, completion, answer):          # per sample
        return float(answer in completion)

    def short(completions, **kwargs):                 # batched, as TRL calls it
        return [float(len(c) < 200) for c in completions]

    FunctionGrader([correct, short], weights=[1.0, 0.5])

Each function is a term of the reward: its value is the `Score` component named after the
function (`correct`, `short`; a repeated name gets `_2`, a lambda is `lambda`), so it shows
in the metrics (`reward/component/NAME`) and the ledger; the reward is the weighted sum of
the terms (weights default to 1.0). As for any grader, a component named `correct`
decides whether a sample passes (`rldojo.graders.base.passed`).

A function's signature says how it is called, by parameter names as TRL names them:
- **batched** when it has a parameter named `prompts` or `completions`: called by keyword
  as TRL calls it, once per group (the G samples of one prompt in a step, gathered by
  `rldojo.graders.gathering`; in an evaluation, one sample):
  `fn(prompts=[...], completions=[...], completion_ids=[...], **columns)`, each of the
  row's other fields a list with one item per sample; it gets those its signature names
  (all of them with `**kwargs`) and returns one number or None per completion. TRL's
  `trainer_state` has no counterpart here and is not passed.
- **per sample** otherwise: `fn(prompt, completion, **fields)`, the row's fields its
  signature names (all of them with `**kwargs`).

`prompt` and `completion` have TRL's shapes: for a row whose prompt is a string, that
string and the completion's text; for a row whose prompt is a list of chat messages, the
messages and `[{"role": "assistant", "content": text}]`.

Failures are statuses, never rewards of 0: a function that raises, or returns anything but
a finite number or None, fails the grade of its samples (`status="error"`, the exception's
line as the explanation, prefixed by the function's name when there are several; its
traceback in `provenance["traceback"]`, which the ledger keeps). None
says that this function does not score this sample, as in TRL: the sum and the components
leave it out (`provenance["skipped"]` names it); when every function returns None the
sample has no reward and its grade fails.

A sync function runs on the rollout engine's event loop, so `rollout.grade_timeout_s`
cannot cut it short; a function that waits on I/O should be `async def`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rldojo.data.loading import DataError
from rldojo.graders.base import TRACEBACK, traceback_text
from rldojo.graders.gathering import GroupGathering
from rldojo.types import Message, Rollout, Score, Task

__all__ = [
    "BATCH_ARGUMENTS",
    "FunctionGrader",
    "RewardFunction",
    "RewardTerm",
    "function_name",
    "is_batched",
    "reward_terms",
    "trl_shapes",
]

RewardFunction = Callable[..., Any]
"""`reward(prompt, completion, **fields) -> float | None`, or TRL's batched
`reward(prompts, completions, **columns) -> list[float | None]`; either may be `async def`."""

BATCH_ARGUMENTS = ("prompts", "completions", "completion_ids")
"""The keywords a batched function gets besides the row's fields (so no field may be so named)."""

Prompt = str | list[Message]
Completion = str | list[Message]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def function_name(fn: object) -> str:
    """`fn.__name__`, else its type's name (a callable object, a `functools.partial`)."""
    return str(getattr(fn, "__name__", type(fn).__name__))


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def is_batched(fn: Callable[..., Any]) -> bool:
    """TRL's batched signature: a parameter named `prompts` or `completions`."""
    sig = _signature(fn)
    return sig is not None and not {"prompts", "completions"}.isdisjoint(sig.parameters)


def _accepted(fn: Callable[..., Any], batched: bool) -> frozenset[str] | None:
    """The keywords `fn` takes (a per-sample function's after its first two positional
    parameters, prompt and completion); None when it takes any (`**kwargs`) or its
    signature cannot be read."""
    sig = _signature(fn)
    if sig is None or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    skipped = set() if batched else {p.name for p in positional[:2]}
    return frozenset(
        p.name
        for p in params
        if p.name not in skipped and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


@dataclass(frozen=True)
class RewardTerm:
    """One reward function of a `FunctionGrader`."""

    fn: RewardFunction
    name: str
    """Its component in the `Score`: the function's name, made unique."""
    weight: float
    batched: bool
    accepts: frozenset[str] | None
    """The keywords it takes; None: any."""


def reward_terms(
    reward: RewardFunction | Sequence[RewardFunction], weights: Sequence[float] | None = None
) -> tuple[RewardTerm, ...]:
    """The terms of one function or a list of them, with their weights (default 1.0 each);
    a TypeError or ValueError (one line) for anything else."""
    fns = list(reward) if isinstance(reward, Sequence) and not isinstance(reward, str) else [reward]
    if not fns:
        raise ValueError("reward: an empty list; give at least one function")
    for fn in fns:
        if not callable(fn):
            raise TypeError(f"reward: expected a function, got {type(fn).__name__}")
    ws = [1.0] * len(fns) if weights is None else list(weights)
    if len(ws) != len(fns):
        raise ValueError(f"reward_weights: {len(ws)} weights for {len(fns)} reward functions")
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"reward_weights: {w!r} is not a finite number")
    names: list[str] = []
    for fn in fns:
        base = re.sub(r"\W+", "_", function_name(fn)).strip("_") or "reward"
        name, n = base, 2
        while name in names:
            name, n = f"{base}_{n}", n + 1
        names.append(name)
    return tuple(
        RewardTerm(fn, name, float(w), is_batched(fn), _accepted(fn, is_batched(fn)))
        for fn, name, w in zip(fns, names, ws, strict=True)
    )


def trl_shapes(task: Task, rollout: Rollout) -> tuple[Prompt, Completion]:
    """The prompt and completion as TRL passes them (fresh copies): strings for a string
    prompt; messages, and the completion as one assistant message, for a chat prompt."""
    if isinstance(task.prompt, str):
        return task.prompt, rollout.completion
    return [dict(m) for m in task.prompt], [{"role": "assistant", "content": rollout.completion}]


@dataclass(frozen=True)
class _Failed:
    why: str
    trace: str = ""  # the traceback of the exception the function raised


Outcome = float | None | _Failed
"""A function's verdict on one sample: its value, None (skipped), or why it failed."""


def _outcome(value: object, term: RewardTerm) -> Outcome:
    if value is None:
        return None
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    shown = _one_line(repr(value))[:80]
    return _Failed(f"{term.name} returned {shown}, not a finite number or None")


def _batch_outcomes(value: object, term: RewardTerm, n: int) -> list[Outcome]:
    """One outcome per completion of a batched function's return value."""
    if hasattr(value, "tolist"):  # a numpy array or a torch tensor
        value = value.tolist()
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) == n:
        return [_outcome(v, term) for v in value]
    shown = _one_line(repr(value))[:80]
    return [
        _Failed(f"{term.name} returned {shown} for {n} completions, not a list of {n} numbers")
    ] * n


async def _call(fn: RewardFunction, label: str | None, *args: Any, **kwargs: Any) -> Any:
    """`fn`'s value (awaited when it is awaitable), or `_Failed` with the exception's line
    (after `label raised` when given)."""
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        why = _one_line(f"{type(exc).__name__}: {exc}")
        return _Failed(why if label is None else f"{label} raised {why}", traceback_text(exc))
    return value


class FunctionGrader:
    """Scores rollouts with reward functions (see the module docstring). `group_size`:
    the samples a batched function waits for before it is called (None: those that arrive
    within `gather_window_s` of each other)."""

    def __init__(
        self,
        reward: RewardFunction | Sequence[RewardFunction],
        weights: Sequence[float] | None = None,
        *,
        group_size: int | None = None,
        gather_window_s: float = 0.25,
    ) -> None:
        self.terms = reward_terms(reward, weights)
        self.name = "reward:" + "+".join(t.name for t in self.terms)
        self._gathering = GroupGathering(
            self.grade_group, name=self.name, group_size=group_size, window_s=gather_window_s
        )

    @property
    def supports_groups(self) -> bool:
        """Whether a function is batched: then `grade` waits for the sample's group."""
        return any(t.batched for t in self.terms)

    def fields(self, term: RewardTerm, task: Task) -> dict[str, Any]:
        """A per-sample call's keyword arguments for `task`: its fields `term` takes."""
        return {k: v for k, v in task.info.items() if term.accepts is None or k in term.accepts}

    def batch_arguments(
        self, term: RewardTerm, rollouts: Sequence[Rollout], task: Task
    ) -> dict[str, Any]:
        """A batched call's keyword arguments: those of `BATCH_ARGUMENTS` and the row's
        fields (each a list, one item per rollout) that `term` takes."""
        shapes = [trl_shapes(task, r) for r in rollouts]
        given = {k: [v] * len(rollouts) for k, v in task.info.items()} | {
            "prompts": [p for p, _ in shapes],
            "completions": [c for _, c in shapes],
            "completion_ids": [list(r.completion_ids) for r in rollouts],
        }
        return {k: v for k, v in given.items() if term.accepts is None or k in term.accepts}

    def check(self, tasks: Sequence[Task], source: str) -> None:
        """A `DataError` (one line) for the first task a function cannot be called on (a
        required parameter no field fills, a field a batched call already names); no
        function is called."""
        for term in self.terms:
            for i, task in enumerate(tasks):
                self._check_call(term, task, f"{source}[{i}]")

    def _check_call(self, term: RewardTerm, task: Task, where: str) -> None:
        clash = sorted(set(BATCH_ARGUMENTS) & task.info.keys()) if term.batched else []
        if clash:
            raise DataError(
                where,
                None,
                f"field {clash[0]!r}: reserved (an argument of the "
                f"batched reward {term.name}); rename the field",
            )
        sig = _signature(term.fn)
        if sig is None:
            return
        try:
            if term.batched:
                probe = Rollout(task_id=task.id, env=task.env, messages=[], completion="")
                sig.bind(**self.batch_arguments(term, [probe], task))
            else:
                sig.bind("prompt", "completion", **self.fields(term, task))
        except TypeError as exc:
            raise DataError(where, None, f"reward {function_name(term.fn)}{sig}: {exc}") from None

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        if self.supports_groups:
            return await self._gathering.grade(rollout, task)
        (score,) = await self.grade_group([rollout], task)
        return score

    async def grade_group(self, rollouts: Sequence[Rollout], task: Task) -> list[Score]:
        """One score per rollout of `task`: each batched function called once for them
        all, each per-sample function once per rollout."""
        by_term = await asyncio.gather(*(self._outcomes(t, rollouts, task) for t in self.terms))
        return [self._score([outcomes[i] for outcomes in by_term]) for i in range(len(rollouts))]

    async def _outcomes(
        self, term: RewardTerm, rollouts: Sequence[Rollout], task: Task
    ) -> list[Outcome]:
        label = term.name if len(self.terms) > 1 else None
        if term.batched:
            value = await _call(term.fn, label, **self.batch_arguments(term, rollouts, task))
            if isinstance(value, _Failed):
                return [value] * len(rollouts)
            return _batch_outcomes(value, term, len(rollouts))
        fields = self.fields(term, task)
        values = await asyncio.gather(
            *(_call(term.fn, label, *trl_shapes(task, r), **fields) for r in rollouts)
        )
        return [v if isinstance(v, _Failed) else _outcome(v, term) for v in values]

    def _score(self, outcomes: Sequence[Outcome]) -> Score:
        """One sample's score from each term's outcome (the module docstring's rules)."""
        provenance: dict[str, Any] = {"grader": self.name}
        failed = [o for o in outcomes if isinstance(o, _Failed)]
        if failed:
            traces = [o.trace for o in failed if o.trace]
            if traces:  # kept in the ledger; the failure budget's stop chains it
                provenance[TRACEBACK] = traces[0]
            return Score.failed("error", "; ".join(o.why for o in failed), provenance=provenance)
        scored: dict[str, float] = {}
        for term, outcome in zip(self.terms, outcomes, strict=True):
            if isinstance(outcome, float):
                scored[term.name] = outcome
        if not scored:
            names = ", ".join(t.name for t in self.terms)
            return Score.failed("error", f"no reward: {names} returned None", provenance=provenance)
        skipped = [t.name for t in self.terms if t.name not in scored]
        if skipped:
            provenance["skipped"] = skipped
        value = sum(t.weight * scored[t.name] for t in self.terms if t.name in scored)
        return Score(value=value, components=scored, provenance=provenance)
