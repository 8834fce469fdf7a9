"""Group judging: one judge call sees all N samples of a task and scores each in [0, 1].

GRPO needs rewards that rank samples *within* a group; a judge that sees the whole group
compares them directly instead of scoring each against an absolute scale it cannot hold
steady. To keep the prompt short and fair:

- the task prompt is shown once; identical samples are shown once and share a score;
- text every sample starts with (a shared prefix of 64+ characters, e.g. a copied
  problem statement or a common first turn) is shown once, each sample shows the rest;
- samples are presented in a deterministic shuffled order (seeded by the group's text),
  so sample 0 is not always first (position bias; `rldojo eval-judge` measures it);
- each sample is fenced as data with the group's nonce; the verdict must echo it and
  score exactly the labels shown (see `rldojo.graders.judges.injection`).

`grade_group(rollouts, task)` judges an explicit group. `grade(rollout, task)` (the
`Grader` protocol, called once per sample by the trainer) gathers the samples of one
group — same task id, seed and policy version — and judges them together when
`group_size` have arrived, or `gather_window_s` after the last one arrived
(`rldojo.graders.gathering`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any, Literal

from rldojo.graders.gathering import GroupGathering
from rldojo.graders.judges.client import (
    JudgeClient,
    JudgeError,
    JudgeRequest,
    Verdict,
    ask_verdict,
    judge_failure,
)
from rldojo.graders.judges.injection import (
    DATA_RULES,
    INJECTION_FLAG,
    VerdictError,
    detect_injection,
    extract_verdict,
    fence,
    nonce_for,
)
from rldojo.graders.judges.rubric import View, prompt_text, sample_text
from rldojo.types import Rollout, Score, Task

__all__ = ["GroupJudgeGrader", "shared_prefix"]

_SYSTEM = """You compare several responses to the same task and score each one from 0 \
(worst) to 1 (best), relative to the others and to the grading instructions. Equal \
quality gets equal scores. Judge content, not length or position.
{data_rules}
Reply with only this JSON object and no other text:
{{"group_id": "<the ID of the response blocks>", "scores": [{{"sample": "<label, e.g. S1>", \
"score": <number from 0 to 1>, "reason": "<at most 20 words>"}}, ...]}}
with exactly one entry per response label."""


def shared_prefix(texts: Sequence[str], min_chars: int = 64) -> str:
    """The common beginning of `texts`, cut back to whitespace; "" if shorter than min_chars."""
    if len(texts) < 2:
        return ""
    first, last = min(texts), max(texts)  # the common prefix of all is theirs
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    prefix = first[:n]
    if len(prefix) < min(len(t) for t in texts):
        cut = max(prefix.rfind(" "), prefix.rfind("\n"))
        prefix = prefix[: cut + 1] if cut >= 0 else ""
    return prefix if len(prefix) >= min_chars else ""


class GroupJudgeGrader:
    """Scores all samples of a group in one judge call (see the module docstring)."""

    version = "1"
    supports_groups = True

    def __init__(
        self,
        judge: JudgeClient,
        *,
        name: str = "group_judge",
        instructions: str = "",
        reference: str | None = None,
        view: View = "final",
        group_size: int | None = None,
        gather_window_s: float = 0.25,
        shuffle: bool = True,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = 0,
        on_injection: Literal["flag", "invalid"] = "flag",
        min_shared_prefix: int = 64,
    ) -> None:
        self.judge = judge
        self.name = name
        self.instructions = instructions
        self.reference = reference
        self.view: View = view
        self.group_size = group_size
        self.gather_window_s = gather_window_s
        self.shuffle = shuffle
        self.sampling = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed}
        self.on_injection = on_injection
        self.min_shared_prefix = min_shared_prefix
        self.system = _SYSTEM.format(data_rules=DATA_RULES)
        self.template_hash = hashlib.sha256(
            f"group/{self.version}\n{self.system}\n{instructions}\n{view}".encode()
        ).hexdigest()[:16]
        self._gathering = GroupGathering(
            self.grade_group, name=name, group_size=group_size, window_s=gather_window_s
        )

    # -------------------------------------------------------------- one explicit group

    def presentation(self, texts: Sequence[str], order: Sequence[int] | None) -> list[str]:
        """Distinct texts in the order the judge sees them."""
        if order is None:
            order = list(range(len(texts)))
            if self.shuffle:
                seed = hashlib.sha256("\x1f".join(texts).encode()).hexdigest()
                random.Random(seed).shuffle(order)
        shown: list[str] = []
        for i in order:
            if texts[i] not in shown:
                shown.append(texts[i])
        return shown

    def build_request(
        self, task: Task, shown: Sequence[str], reference: str | None
    ) -> tuple[JudgeRequest, str, list[str]]:
        """The judge request, the group nonce and the labels (S1, S2, ...) in order."""
        nonce = nonce_for(self.template_hash, *shown)
        labels = [f"S{i + 1}" for i in range(len(shown))]
        prefix = shared_prefix(shown, self.min_shared_prefix)
        parts = ["# Task given to the model", fence(prompt_text(task), "TASK", nonce)]
        if reference:
            parts += ["# Reference answer (trusted)", reference]
        if self.instructions:
            parts += ["# Grading instructions", self.instructions]
        parts.append(f"# {len(shown)} responses to score (ID {nonce})")
        if prefix:
            parts += [
                "Every response begins with the same text, shown once here; each block "
                "below holds only the rest of its response.",
                fence(prefix, "SHARED", nonce),
            ]
        for label, text in zip(labels, shown, strict=True):
            parts.append(fence(text[len(prefix) :], label, nonce))
        parts.append("Reply with the JSON object now.")
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
        return JudgeRequest(messages, **self.sampling), nonce, labels  # type: ignore[arg-type]

    @staticmethod
    def parse(reply: str, nonce: str, labels: Sequence[str]) -> dict[str, tuple[float, str]]:
        """Label -> (score, reason); VerdictError unless every label is scored once in [0, 1]."""
        obj = extract_verdict(reply, id_key="group_id", nonce=nonce)
        entries = obj.get("scores")
        if not isinstance(entries, list):
            raise VerdictError('"scores" must be a list')
        found: dict[str, tuple[float, str]] = {}
        for entry in entries:
            label = str(entry.get("sample")) if isinstance(entry, dict) else ""
            if label not in labels:
                raise VerdictError(f"unknown sample label {label!r} (labels: {list(labels)})")
            if label in found:
                raise VerdictError(f"sample {label} is scored twice")
            value = entry.get("score")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise VerdictError(f"sample {label}: score must be a number")
            if not 0.0 <= value <= 1.0:
                raise VerdictError(f"sample {label}: score {value} is outside [0, 1]")
            found[label] = (float(value), str(entry.get("reason", ""))[:300])
        missing = [label for label in labels if label not in found]
        if missing:
            raise VerdictError(f"missing scores for {missing}")
        return found

    async def grade_group(
        self, rollouts: Sequence[Rollout], task: Task, *, order: Sequence[int] | None = None
    ) -> list[Score]:
        """One score per rollout, from one judge call (plus at most one repair turn).

        `order` fixes the presentation order (indices into `rollouts`; the bias probe
        uses it); None uses the grader's deterministic shuffle.
        """
        texts = [sample_text(r, self.view) for r in rollouts]
        patterns = [detect_injection(t) for t in texts]
        flags = [(INJECTION_FLAG,) if p else () for p in patterns]
        refused = [bool(p) and self.on_injection == "invalid" for p in patterns]
        base = {"grader": self.name, "version": self.version, "group_size": len(rollouts)}
        keep = [i for i in range(len(texts)) if not refused[i]]
        if not keep:
            return [self._refused(base, patterns[i], flags[i]) for i in range(len(texts))]
        kept_texts = [texts[i] for i in keep]
        kept_order = None if order is None else [keep.index(i) for i in order if i in keep]
        shown = self.presentation(kept_texts, kept_order)
        try:
            reference = self._reference(task)
        except ValueError as exc:
            return [Score.failed("invalid", str(exc), provenance=base) for _ in texts]
        request, nonce, labels = self.build_request(task, shown, reference)
        provenance = base | self.judge.provenance(request, self.template_hash)
        provenance["group_id"] = nonce
        try:
            verdict = await ask_verdict(
                self.judge,
                request,
                self.template_hash,
                lambda reply: self.parse(reply, nonce, labels),
                lambda error: (
                    f"Your reply could not be used: {error}. Reply again with only the JSON "
                    f'object, with "group_id": "{nonce}" and one score for each of {labels}.'
                ),
            )
        except JudgeError as exc:
            return [
                self._refused(base, patterns[i], flags[i])
                if refused[i]
                else judge_failure(exc, provenance, flags[i])
                for i in range(len(texts))
            ]
        provenance |= {"attempts": verdict.attempts, "cache_hit": verdict.cached}
        return [
            self._refused(base, patterns[i], flags[i])
            if refused[i]
            else self._sample_score(verdict, shown.index(text), labels, provenance, patterns[i])
            for i, text in enumerate(texts)
        ]

    @staticmethod
    def _sample_score(
        verdict: Verdict[dict[str, tuple[float, str]]],
        position: int,
        labels: Sequence[str],
        provenance: dict[str, Any],
        patterns: list[str],
    ) -> Score:
        """One sample's Score from the group verdict (its label is `labels[position]`)."""
        label = labels[position]
        flags = (INJECTION_FLAG,) if patterns else ()
        mine = provenance | {"label": label, "position": position}
        mine["injection_patterns"] = patterns
        if verdict.value is None:
            return Score.failed("invalid", verdict.error, provenance=mine, flags=flags)
        value, reason = verdict.value[label]
        return Score(
            value,
            components={"group_score": value},
            flags=flags,
            explanation=reason,
            provenance=mine,
        )

    def _reference(self, task: Task) -> str | None:
        if self.reference is None:
            return task.answer
        from rldojo.graders.openai_templates import item_view, render

        return render(self.reference, {}, item_view(task), field=f"{self.name}.reference")

    @staticmethod
    def _refused(base: dict[str, Any], patterns: list[str], flags: tuple[str, ...]) -> Score:
        why = f"sample addresses the judge ({', '.join(patterns)})"
        provenance = base | {"injection_patterns": patterns}
        return Score.failed("invalid", why, provenance=provenance, flags=flags)

    # -------------------------------------------------------------- per-sample protocol

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        """Wait for the rest of this sample's group, then judge the group (module docstring)."""
        return await self._gathering.grade(rollout, task)
