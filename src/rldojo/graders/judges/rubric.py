"""Rubric grading with an LLM judge (HealthBench-style criteria with signed points).

    grader = RubricGrader(judge, [
        Criterion("correct", "States that the answer is 12", 5),
        Criterion("shows_work", "Shows the computation", 2),
        Criterion("wrong_step", "Contains an incorrect intermediate step", -4),
    ])

The judge sees the task, the reference answer (if any), the rubric and the sample (fenced
as data, see `rldojo.graders.judges.injection`) and returns strict JSON: per criterion, met or
not and a short reason. For a negative criterion, *met* means the flaw is present.

    value = clip( Σ points of met criteria / Σ positive points, 0, 1 )
    components = {criterion id: 1.0 if met else 0.0}

The verdict must name exactly the rubric's criterion ids and echo the sample's nonce; a
reply that does not is repaired once (the judge is told what was wrong), then the score
is `invalid`. Judge transport failures are `error` / `timeout`. Never 0.

Criteria come from the grader, or per task from ``task.info[criteria_field]`` (as in
HealthBench: ``[{"criterion": "...", "points": 5}, ...]``). `view="trace"` shows the judge
the whole trajectory (every policy and environment turn), so criteria can penalise right
answers reached by wrong steps (`TRACE_CRITERIA`). With a tokenizer, met negative
criteria whose verdict quotes the offending text become token rewards on that span.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rldojo.graders.judges.client import (
    JudgeClient,
    JudgeError,
    JudgeRequest,
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
from rldojo.graders.token_rewards import quote_spans, spans_to_token_rewards
from rldojo.policy.base import Tokenizer
from rldojo.types import Rollout, Score, Task

__all__ = [
    "TRACE_CRITERIA",
    "Criterion",
    "RubricGrader",
    "parse_criteria",
    "prompt_text",
    "sample_text",
]

View = Literal["final", "trace"]


@dataclass(frozen=True)
class Criterion:
    """One rubric line: `points` > 0 rewards meeting it, < 0 penalises the flaw it names."""

    id: str
    text: str
    points: float


TRACE_CRITERIA = (
    Criterion(
        "wrong_step",
        "The reasoning contains an incorrect intermediate step (a wrong calculation, a "
        "false statement, or a step that does not follow), even if the final answer is right.",
        -5,
    ),
    Criterion(
        "unsupported_answer",
        "The final answer does not follow from the reasoning shown (it is guessed or "
        "asserted rather than derived).",
        -3,
    ),
)
"""Process criteria for `view="trace"`: right answers reached by wrong steps lose points."""


def parse_criteria(raw: object, field: str = "criteria") -> list[Criterion]:
    """Criteria from dicts with `id` (default c1, c2, ...), `text` or `criterion`, `points`."""
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ValueError(f"{field}: expected a non-empty list of criteria")
    out: list[Criterion] = []
    for i, entry in enumerate(raw):
        where = f"{field}[{i}]"
        if isinstance(entry, Criterion):
            out.append(entry)
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected a table with text and points")
        unknown = set(entry) - {"id", "text", "criterion", "points", "tags"}
        if unknown:
            raise ValueError(f"{where}.{sorted(unknown)[0]}: unknown key")
        text = entry.get("text", entry.get("criterion"))
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}.text: expected the criterion's text")
        points = entry.get("points")
        if isinstance(points, bool) or not isinstance(points, int | float) or points == 0:
            raise ValueError(f"{where}.points: expected a non-zero number, got {points!r}")
        cid = str(entry.get("id", f"c{i + 1}"))
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", cid):
            raise ValueError(f"{where}.id: use letters, digits, _ . - (got {cid!r})")
        out.append(Criterion(cid, text.strip(), float(points)))
    ids = [c.id for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{field}: duplicate criterion id {_first_duplicate(ids)!r}")
    if not any(c.points > 0 for c in out):
        raise ValueError(f"{field}: at least one criterion needs positive points")
    return out


def _first_duplicate(ids: list[str]) -> str:
    seen: set[str] = set()
    for cid in ids:
        if cid in seen:
            return cid
        seen.add(cid)
    return ""


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def sample_text(rollout: Rollout, view: View) -> str:
    """What the judge grades: the final turn (reasoning blocks removed) or the whole trace."""
    if view == "final":
        return _THINK.sub("", rollout.completion).strip() or rollout.completion
    first = next((i for i, m in enumerate(rollout.messages) if m.get("role") == "assistant"), None)
    if first is None:
        return rollout.completion
    return "\n\n".join(f"[{m['role']}]\n{m.get('content', '')}" for m in rollout.messages[first:])


def prompt_text(task: Task) -> str:
    if isinstance(task.prompt, str):
        return task.prompt
    return "\n\n".join(f"[{m['role']}]\n{m.get('content', '')}" for m in task.prompt)


_SYSTEM = """You are a strict, fair grader. You check one response against a rubric.
For each criterion decide whether it is met. For a criterion with positive points, met \
means the response does what the criterion describes. For a criterion with negative \
points, met means the response HAS the flaw the criterion describes.
{view_rule}
{data_rules}
Reply with only this JSON object and no other text:
{{"sample_id": "<the ID of the response block>", "criteria": [{{"id": "<criterion id>", \
"met": true or false, "reason": "<at most 25 words>"{quote}}}, ...]}}
with exactly one entry per criterion id of the rubric."""

_VIEW_RULES = {
    "final": "Grade the final response as written.",
    "trace": "You see the whole reasoning trace, not only the final answer. Judge every "
    "step: a right final answer reached through a wrong or unjustified step does not meet "
    "criteria about correct reasoning, and it does meet criteria that describe such flaws.",
}
_QUOTE = (
    ', "quote": "<if a negative criterion is met: the offending text copied exactly, else empty>"'
)


class RubricGrader:
    """Signed-points rubric judged by an LLM (see the module docstring).

    Args:
        judge: the judge client (backend + cache).
        criteria: the rubric; None reads it per task from ``task.info[criteria_field]``.
        reference: reference answer template: a literal, or ``"{{item.x}}"``-style (the
            task's `answer` is used when None and the task has one).
        instructions: extra grading instructions shown to the judge.
        view: `final` (the final turn) or `trace` (the whole trajectory).
        on_injection: `flag` (add ``hack:judge_injection`` to the flags) or `invalid`
            (also refuse to score the sample).
        tokenizer: the policy's tokenizer; enables token rewards on quoted spans.
    """

    version = "1"

    def __init__(
        self,
        judge: JudgeClient,
        criteria: Sequence[Criterion] | Sequence[Mapping[str, Any]] | None = None,
        *,
        name: str = "rubric",
        reference: str | None = None,
        instructions: str = "",
        view: View = "final",
        criteria_field: str = "rubric",
        temperature: float = 0.0,
        max_tokens: int = 512,
        seed: int | None = 0,
        on_injection: Literal["flag", "invalid"] = "flag",
        tokenizer: Tokenizer | str | None = None,
        pass_threshold: float = 1.0,
    ) -> None:
        if view not in _VIEW_RULES:
            raise ValueError(f"view: expected final or trace, got {view!r}")
        if on_injection not in ("flag", "invalid"):
            raise ValueError(f"on_injection: expected flag or invalid, got {on_injection!r}")
        self.judge = judge
        self.criteria = parse_criteria(criteria) if criteria is not None else None
        self.name = name
        self.reference = reference
        self.instructions = instructions
        self.view: View = view
        self.criteria_field = criteria_field
        self.sampling = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed}
        self.on_injection = on_injection
        if isinstance(tokenizer, str):
            from rldojo.policy.models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.pass_threshold = pass_threshold
        self.system = _SYSTEM.format(
            view_rule=_VIEW_RULES[view],
            data_rules=DATA_RULES,
            quote=_QUOTE if tokenizer is not None else "",
        )
        self.template_hash = hashlib.sha256(
            f"rubric/{self.version}\n{self.system}\n{instructions}".encode()
        ).hexdigest()[:16]

    # -------------------------------------------------------------- prompt and verdict

    def _reference(self, rollout: Rollout, task: Task) -> str | None:
        if self.reference is None:
            return task.answer
        from rldojo.graders.openai_templates import item_view, render, sample_view

        return render(
            self.reference, sample_view(rollout), item_view(task), field=f"{self.name}.reference"
        )

    def build_request(
        self, task: Task, text: str, criteria: Sequence[Criterion], reference: str | None
    ) -> tuple[JudgeRequest, str]:
        """The judge request for one sample, and the sample's nonce."""
        nonce = nonce_for(self.template_hash, text)
        parts = ["# Task given to the model", fence(prompt_text(task), "TASK", nonce)]
        if reference:
            parts += ["# Reference answer (trusted)", reference]
        if self.instructions:
            parts += ["# Additional grading instructions", self.instructions]
        parts.append("# Rubric")
        parts += [f"- id: {c.id} | points: {c.points:+g} | criterion: {c.text}" for c in criteria]
        what = "trace" if self.view == "trace" else "response"
        parts += [f"# The {what} to grade (ID {nonce})", fence(text, "SAMPLE", nonce)]
        parts.append("Reply with the JSON object now.")
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
        return JudgeRequest(messages, **self.sampling), nonce  # type: ignore[arg-type]

    @staticmethod
    def parse(reply: str, nonce: str, criteria: Sequence[Criterion]) -> dict[str, dict[str, Any]]:
        """Criterion id -> {"met", "reason", "quote"}; VerdictError unless the reply is a
        verdict for this sample covering exactly the rubric's criteria."""
        obj = extract_verdict(reply, id_key="sample_id", nonce=nonce)
        entries = obj.get("criteria")
        if not isinstance(entries, list):
            raise VerdictError('"criteria" must be a list')
        wanted = [c.id for c in criteria]
        found: dict[str, dict[str, Any]] = {}
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise VerdictError('every entry of "criteria" needs a string "id"')
            cid = entry["id"]
            if cid not in wanted:
                raise VerdictError(f"unknown criterion id {cid!r} (rubric ids: {wanted})")
            if cid in found:
                raise VerdictError(f"criterion {cid!r} is graded twice")
            if not isinstance(entry.get("met"), bool):
                raise VerdictError(f'criterion {cid!r}: "met" must be true or false')
            reason, quote = entry.get("reason", ""), entry.get("quote", "")
            found[cid] = {
                "met": entry["met"],
                "reason": str(reason)[:300],
                "quote": quote if isinstance(quote, str) else "",
            }
        missing = [cid for cid in wanted if cid not in found]
        if missing:
            raise VerdictError(f"missing criteria {missing}")
        return found

    # -------------------------------------------------------------- grading

    def _criteria_for(self, task: Task) -> list[Criterion]:
        if self.criteria is not None:
            return self.criteria
        raw = task.info.get(self.criteria_field)
        return parse_criteria(raw, f"task {task.id} info.{self.criteria_field}")

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        base = {"grader": self.name, "version": self.version, "view": self.view}
        try:
            criteria = self._criteria_for(task)
            reference = self._reference(rollout, task)
        except ValueError as exc:
            return Score.failed("invalid", str(exc), provenance=base)
        text = sample_text(rollout, self.view)
        suspicious = detect_injection(text)
        flags = (INJECTION_FLAG,) if suspicious else ()
        request, nonce = self.build_request(task, text, criteria, reference)
        provenance = base | self.judge.provenance(request, self.template_hash)
        provenance |= {"sample_id": nonce, "injection_patterns": suspicious}
        if suspicious and self.on_injection == "invalid":
            why = f"sample addresses the judge ({', '.join(suspicious)})"
            return Score.failed("invalid", why, provenance=provenance, flags=flags)
        ids = [c.id for c in criteria]
        try:
            verdict = await ask_verdict(
                self.judge,
                request,
                self.template_hash,
                lambda reply: self.parse(reply, nonce, criteria),
                lambda error: (
                    f"Your reply could not be used: {error}. Reply again with only the JSON "
                    f'object, with "sample_id": "{nonce}" and one entry for each criterion '
                    f"id in {ids}."
                ),
            )
        except JudgeError as exc:
            return judge_failure(exc, provenance, flags)
        provenance |= {"attempts": verdict.attempts, "cache_hit": verdict.cached}
        if verdict.value is None:
            return Score.failed("invalid", verdict.error, provenance=provenance, flags=flags)
        return self._score(rollout, criteria, verdict.value, provenance, flags)

    def _score(
        self,
        rollout: Rollout,
        criteria: Sequence[Criterion],
        found: Mapping[str, Mapping[str, Any]],
        provenance: dict[str, Any],
        flags: tuple[str, ...],
    ) -> Score:
        positive = sum(c.points for c in criteria if c.points > 0)
        points = sum(c.points for c in criteria if found[c.id]["met"])
        value = min(1.0, max(0.0, points / positive))
        provenance["points"] = points
        explanation = "; ".join(
            f"{c.id}: {'met' if found[c.id]['met'] else 'not met'}"
            + (f" ({found[c.id]['reason']})" if found[c.id]["reason"] else "")
            for c in criteria
        )
        return Score(
            value,
            components={c.id: 1.0 if found[c.id]["met"] else 0.0 for c in criteria},
            flags=flags,
            token_rewards=self._token_rewards(rollout, criteria, found, positive),
            explanation=explanation,
            provenance=provenance,
        )

    def _token_rewards(
        self,
        rollout: Rollout,
        criteria: Sequence[Criterion],
        found: Mapping[str, Mapping[str, Any]],
        positive: float,
    ) -> tuple[float, ...] | None:
        """Each met negative criterion's points / Σ positive points on its quoted span."""
        if self.tokenizer is None:
            return None
        spans = [
            span
            for c in criteria
            if c.points < 0 and found[c.id]["met"]
            for span in quote_spans(rollout.completion, found[c.id]["quote"], c.points / positive)
        ]
        if not spans:
            return None
        return spans_to_token_rewards(self.tokenizer, rollout, spans)
