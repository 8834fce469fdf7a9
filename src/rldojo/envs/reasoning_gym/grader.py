"""The grader of reasoning-gym-v1: the answer a reply gives, scored by its dataset.

`final_answer` finds the answer in the forms a small model actually writes: the requested
``<answer>X</answer>``, else whichever comes last of an ``Answer: X`` line (or a
``\\boxed{X}``, as `rldojo.graders.rules.extract_answer` reads them) and a sentence
"the (final) answer is X". SmolLM2 ends with "The final answer is 7." far more often than
with tags; an extractor that ignored it left every group of a run uninformative.

`ReasoningGymGrader` scores that answer with the dataset's own ``score_answer(answer,
entry)``: the dataset recorded in the task (`Task.info["dataset"]`), so a mix of datasets
grades each task by its own rules. The score's value is that correctness score, minus
`format_penalty` when no answer was found. Components: ``correct`` (1 at a full score),
``score``, ``format`` (1 when an answer was found) and ``tagged`` (1 when it was in the
requested tags), a small format signal that leaves the pass/fail value alone. A scorer
that raises is a failed score (``error``), never a 0; one past `timeout_s`, ``timeout``.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import re
from types import ModuleType
from typing import Any

from rldojo.graders.rules import NO_ANSWER_FLAG, extract_answer, last_boxed
from rldojo.types import Rollout, Score, Task

__all__ = ["OptionalDependencyError", "ReasoningGymGrader", "final_answer", "reasoning_gym"]

ENV_ID = "reasoning-gym-v1"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PHRASE = re.compile(r"\banswer\s+is\b\s*:?[ \t]*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")


class OptionalDependencyError(ImportError):
    """An optional extra needed by this environment is not installed."""


def reasoning_gym() -> ModuleType:
    """The reasoning_gym module, or `OptionalDependencyError` saying how to install it."""
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as exc:
        raise OptionalDependencyError(
            f"{ENV_ID} needs the optional package reasoning-gym: pip install reasoning-gym "
            f"(the extra rldojo[reasoning-gym]) ({exc})"
        ) from None


def _scorer(source: tuple[Any, ...]) -> Any:
    try:
        return _cached_scorer(*source)
    except TypeError:  # unhashable config values: build it uncached
        return _cached_scorer.__wrapped__(*source)


@functools.lru_cache(maxsize=64)
def _cached_scorer(dataset: str, seed: int, size: int, config: tuple[tuple[str, Any], ...]) -> Any:
    rg = reasoning_gym()
    if hasattr(rg, "get_score_answer_fn"):
        return rg.get_score_answer_fn(dataset)
    return rg.create_dataset(dataset, seed=seed, size=size, **dict(config)).score_answer


def _phrase_answer(text: str, match: re.Match[str]) -> str | None:
    """The X of "the answer is X.": up to the sentence's end, a ``\\boxed{}`` opened."""
    tail = text[match.end() :].split("\n", 1)[0]
    boxed = last_boxed(tail)
    if boxed is not None:
        tail = boxed
    else:
        end = _SENTENCE_END.search(tail)
        tail = tail[: end.start()] if end else tail
    return extract_answer(f"Answer: {tail}", strict=True)  # the rules' own clean-up


def final_answer(text: str) -> str | None:
    """The last ``<answer>...</answer>``, else the later of an ``Answer:`` line (or
    ``\\boxed{}``) and "the answer is X"; None when there is none (module docstring)."""
    found = _ANSWER.findall(text)
    if found:
        return str(found[-1]).strip()
    line = extract_answer(text)
    phrases = list(_PHRASE.finditer(text))
    phrase = _phrase_answer(text, phrases[-1]) if phrases else None
    if phrase is None or line is None:
        return line if phrase is None else phrase
    return phrase if phrases[-1].start() > text.rfind(line) else line


class ReasoningGymGrader:
    """``score_answer(answer, entry)`` of the task's dataset (see the module docstring)."""

    name = "reasoning_gym"
    version = "2"

    def __init__(self, *, format_penalty: float = 0.0, timeout_s: float = 10.0) -> None:
        self.format_penalty = format_penalty
        self.timeout_s = timeout_s

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = {"grader": self.name, "version": self.version, "dataset": task.info.get("dataset")}
        source = task.info.get("source")
        entry = task.info.get("entry")
        if not source or entry is None:
            return Score.failed(
                "invalid", f"task {task.id} is not a reasoning-gym task", provenance=prov
            )
        answer = final_answer(rollout.completion)
        if answer is None:
            return Score(
                -self.format_penalty,
                components={"correct": 0.0, "format": 0.0, "tagged": 0.0},
                flags=(NO_ANSWER_FLAG,),
                explanation="no answer found",
                provenance=prov,
            )
        try:
            score_fn = _scorer(tuple(source))
            value = await asyncio.wait_for(
                asyncio.to_thread(score_fn, answer=answer, entry=entry), self.timeout_s
            )
        except TimeoutError:
            return Score.failed(
                "timeout", f"score_answer took longer than {self.timeout_s:g}s", provenance=prov
            )
        except Exception as exc:  # the scorer's failure is not the policy's 0
            return Score.failed(
                "error", f"score_answer raised {type(exc).__name__}: {exc}", provenance=prov
            )
        value = float(value or 0.0)
        tagged = 1.0 if _ANSWER.search(rollout.completion) else 0.0
        return Score(
            value,
            components={
                "correct": 1.0 if value >= 1.0 else 0.0,
                "format": 1.0,
                "tagged": tagged,
                "score": value,
            },
            explanation=f"answer {answer[:80]!r}",
            provenance=prov,
        )
