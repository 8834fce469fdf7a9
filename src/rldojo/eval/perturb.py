"""Robustness probes: the same eval under prompt perturbations, the score spread and flips.

A `Perturbation` rewrites a task's prompt and nothing else that matters: the task id, the
reference answer's content and the grader stay the same, so per-task outcomes pair up
across variants. For multiple-choice tasks (`rldojo.envs.mcq.items`) it can change
the option labels (A/B/C/D -> 1/2/3/4 or a)/b)...), shuffle the option order, and swap the
template or the answer instruction; the task's label mapping is re-rendered, so choosing
the right option stays right. For short-answer tasks (arith-v1, math-v1: `info["question"]`
plus an instruction) it swaps the template and the answer-format instruction.

`robustness_report` turns per-variant, per-task outcomes into accuracy with intervals, the
spread (max - min) across variants, each variant's paired difference to the baseline, and
the tasks whose outcome flips. Evaluate greedily: with sampling, part of every flip is
sampling noise rather than sensitivity to the format.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rldojo.envs.mcq.items import item_from_task, reformat
from rldojo.eval.harness import wilson_interval
from rldojo.eval.stats import paired_bootstrap
from rldojo.types import Task

__all__ = [
    "SHORT_INSTRUCTIONS",
    "SHORT_TEMPLATES",
    "Perturbation",
    "default_suite",
    "robustness_report",
]

SHORT_TEMPLATES: dict[str, str] = {
    "plain": "{question}\n{instruction}",
    "qa": "Question: {question}\n\n{instruction}",
    "instruction_first": "{instruction}\n\n{question}",
    "markdown": "### Problem\n{question}\n\n### Instructions\n{instruction}",
}
SHORT_INSTRUCTIONS: dict[str, str | None] = {
    "default": None,  # the task's own instruction
    "terse": "Give only the final answer, on a line 'Answer: <answer>'.",
    "think": "Think step by step, then end with a line 'Answer: <answer>'.",
    "boxed": "Put the final answer in \\boxed{}.",
}


@dataclass(frozen=True)
class Perturbation:
    """One variant of the prompt format; None fields keep the task's own setting.

    `labels`, `order_seed` apply to multiple-choice tasks only; `template` and
    `instruction` name entries of the MC tables or of `SHORT_TEMPLATES` /
    `SHORT_INSTRUCTIONS` for short-answer tasks.
    """

    name: str
    labels: str | None = None
    order_seed: int | None = None
    template: str | None = None
    instruction: str | None = None

    def apply(self, task: Task) -> Task:
        """The task with its prompt rewritten (id, answer content and grading unchanged)."""
        if item_from_task(task) is not None:
            changes: dict[str, Any] = {
                k: v
                for k, v in (
                    ("labels", self.labels),
                    ("order_seed", self.order_seed),
                    ("template", self.template),
                    ("instruction", self.instruction),
                )
                if v is not None
            }
            return reformat(task, **changes)
        if self.labels is not None or self.order_seed is not None:
            return task  # option labels and order mean nothing without options
        return self._apply_short(task)

    def _apply_short(self, task: Task) -> Task:
        question = task.info.get("question")
        if not isinstance(task.prompt, str) or not isinstance(question, str):
            raise ValueError(
                f"task {task.id}: short-answer perturbations need a string prompt and "
                "info['question'] (as arith-v1 and math-v1 provide)"
            )
        own = task.prompt.removeprefix(question).strip()
        instruction = SHORT_INSTRUCTIONS.get(self.instruction or "default") or own
        template = SHORT_TEMPLATES[self.template or "plain"]
        prompt = template.format(question=question, instruction=instruction).strip()
        return Task(task.id, prompt, task.answer, task.info, task.env)


def default_suite(multiple_choice: bool) -> list[Perturbation]:
    """The standard probes: baseline first, then one change at a time."""
    suite = [Perturbation("baseline")]
    if multiple_choice:
        suite += [
            Perturbation("labels=numbers", labels="numbers"),
            Perturbation("labels=paren", labels="paren"),
            Perturbation("shuffle=1", order_seed=1),
            Perturbation("shuffle=2", order_seed=2),
            Perturbation("template=qa", template="qa"),
            Perturbation("template=instruction_first", template="instruction_first"),
            Perturbation("instruction=terse", instruction="terse"),
            Perturbation("instruction=think", instruction="think"),
        ]
    else:
        suite += [
            Perturbation("template=qa", template="qa"),
            Perturbation("template=instruction_first", template="instruction_first"),
            Perturbation("template=markdown", template="markdown"),
            Perturbation("instruction=terse", instruction="terse"),
            Perturbation("instruction=think", instruction="think"),
            Perturbation("instruction=boxed", instruction="boxed"),
        ]
    return suite


def select_suite(names: Sequence[str], multiple_choice: bool) -> list[Perturbation]:
    """The named probes of the default suite (``all`` for every one); baseline always first."""
    suite = default_suite(multiple_choice)
    if not names or "all" in names:
        return suite
    known = {p.name: p for p in suite}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown perturbation(s) {unknown}; known: {sorted(known)}")
    return [suite[0], *(known[n] for n in names if n != "baseline")]


def robustness_report(
    outcomes: Mapping[str, Mapping[str, bool]],
    *,
    baseline: str = "baseline",
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Summarise per-variant outcomes (``{variant: {task_id: passed}}``).

    Accuracy (Wilson 95% interval) per variant over the tasks every variant has; the
    spread max - min and the std across variants; each variant's paired difference to
    `baseline` (paired bootstrap); and the tasks whose outcome is not the same under all
    variants, with their outcome per variant.
    """
    if baseline not in outcomes:
        raise ValueError(f"no baseline variant {baseline!r} among {sorted(outcomes)}")
    common = sorted(set.intersection(*(set(o) for o in outcomes.values())))
    base = [float(outcomes[baseline][t]) for t in common]
    variants: dict[str, Any] = {}
    for name, per_task in outcomes.items():
        values = [float(per_task[t]) for t in common]
        k = int(sum(values))
        acc = k / len(values) if values else math.nan
        diff = paired_bootstrap(base, values, n_resamples=n_resamples, seed=seed)
        variants[name] = {
            "accuracy": acc,
            "ci95": list(wilson_interval(k, len(values))),
            "diff_vs_baseline": diff.diff,
            "diff_ci95": list(diff.ci),
        }
    accs = np.array([v["accuracy"] for v in variants.values()], dtype=float)
    flips = [
        {"task_id": t, "outcomes": {name: bool(outcomes[name][t]) for name in outcomes}}
        for t in common
        if len({bool(outcomes[name][t]) for name in outcomes}) > 1
    ]
    return {
        "tasks": len(common),
        "variants": variants,
        "spread": float(accs.max() - accs.min()) if accs.size else math.nan,
        "std": float(accs.std()) if accs.size else math.nan,
        "flip_rate": len(flips) / len(common) if common else math.nan,
        "flips": flips,
    }
