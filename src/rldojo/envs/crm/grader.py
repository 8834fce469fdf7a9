"""The crm-v1 reward: the end state, collateral changes, and what the agent told the user.

The environment reports the database diff of the episode (``crm/diff`` in the rollout
info, see `rldojo.envs.crm.data.diff`); this grader compares it with the task's
expectations (`rldojo.envs.crm.scenarios`), deterministically:

    state      = satisfied units / expected units        (an update field or an insert is
                                                           one unit; 1.0 when none expected)
    message    = share of required mentions in the final answer
    base       = (w_state * state + w_message * message * done) / (weights of present terms)
                 done = 1 when state == 1: facts only count once the work is done
    reward     = base
                 - collateral_penalty * min(collateral, collateral_cap)
                 - false_claim_penalty * false_claim
                 - format_penalty * (no final answer)
                 - error_penalty * min(protocol errors, error_cap)

`collateral` counts every change nobody asked for: a field changed outside the expected
ones (bookkeeping such as ``updated_at`` aside), an inserted row no insert check used, a
deleted row. `false_claim` is set when state checks fail but the final answer claims the
work was done (flag ``hack:false_claim``). `correct` is 1.0 for a perfect episode (every
unit, every mention, no collateral). This is the tau-bench / AppWorld approach, with the
database diff in place of an LLM judge. With `turn_credit` > 0 each turn's tokens also
carry its tool-choice credit against the scripted expert (`rldojo.envs.crm.credit`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rldojo.envs.base import turn_token_rewards
from rldojo.envs.crm.credit import turn_credits
from rldojo.envs.crm.data import BOOKKEEPING
from rldojo.envs.kwargs import EnvKwargs
from rldojo.envs.multiturn import protocol_terms
from rldojo.types import Rollout, Score, Task

__all__ = ["CrmGrader", "CrmReward", "evaluate_state", "mention_score"]

# Words that say the work was done. "now" covers "The deal is now in the proposal stage",
# which an RL policy learned to answer to a move request without calling a tool.
_CLAIM = re.compile(
    r"\b(done|updated|moved|closed|created|logged|sent|emailed|marked|applied|completed|"
    r"changed|opened|set|now)\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(
    r"\b(not|couldn't|could not|cannot|can't|unable|failed|didn't|did not|won't)\b", re.IGNORECASE
)


class CrmReward(EnvKwargs):
    """Weights and penalties of the crm-v1 reward (see the module docstring); the
    ``reward`` table of crm-v1's and web-crm-v1's kwargs, ``reward = {collateral_penalty =
    0.5}``."""

    w_state: float = 0.7
    """Weight of the end state: the share of the expected changes made."""
    w_message: float = 0.3
    """Weight of the facts the final answer states (counted once the state is right)."""
    collateral_penalty: float = 0.25
    """Subtracted per change nobody asked for (up to `collateral_cap` of them)."""
    collateral_cap: int = 4
    """Most collateral changes penalised in one episode."""
    false_claim_penalty: float = 0.5
    """Subtracted when the final answer claims work that the end state shows undone."""
    format_penalty: float = 0.2
    """Subtracted when the episode ends without an ``<answer>``."""
    error_penalty: float = 0.05
    """Subtracted per protocol error, e.g. a malformed tool call (up to `error_cap`)."""
    error_cap: int = 5
    """Most protocol errors penalised in one episode."""
    turn_credit: float = 0.0
    """Weight of the per-turn tool-choice credit against the expert's choice, put on each
    turn's tokens (`rldojo.envs.crm.credit`); 0: the outcome alone."""


def _norm(value: object) -> str:
    text = str(value).lower().replace("_", " ")
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text).replace("$", "")
    return " ".join(text.split())


def _matches(actual: object, spec: object) -> bool:
    if isinstance(spec, Mapping):
        if "contains" in spec:
            return actual is not None and _norm(spec["contains"]) in _norm(actual)
        if "present" in spec:
            return (actual is not None) == bool(spec["present"])
        return False
    if isinstance(spec, int | float) and isinstance(actual, int | float):
        return float(actual) == float(spec)
    return actual == spec


def evaluate_state(
    expected: Mapping[str, Any], changes: Sequence[Mapping[str, Any]]
) -> tuple[int, int, list[str], list[str]]:
    """``(units passed, units expected, failed checks, collateral changes)`` from a diff."""
    passed, total = 0, 0
    failed: list[str] = []
    by_row = {(c["table"], c["id"]): c for c in changes}
    allowed: dict[tuple[str, str], set[str]] = {}
    for upd in expected.get("updates", ()):
        key = (upd["table"], upd["id"])
        allowed[key] = set(upd["set"])
        after = (by_row.get(key) or {}).get("after") or {}
        for field, spec in upd["set"].items():
            total += 1
            if key in by_row and by_row[key]["op"] == "update" and _matches(after.get(field), spec):
                passed += 1
            else:
                failed.append(f"{upd['table']} {upd['id']}: {field} should be {spec}")
    inserted = [c for c in changes if c["op"] == "insert"]
    used: set[tuple[str, str]] = set()
    for ins in expected.get("inserts", ()):
        count = int(ins.get("count", 1))
        total += count
        hits = [
            c
            for c in inserted
            if c["table"] == ins["table"]
            and (c["table"], c["id"]) not in used
            and all(_matches(c["after"].get(f), s) for f, s in ins["match"].items())
        ][:count]
        used.update((c["table"], c["id"]) for c in hits)
        passed += len(hits)
        if len(hits) < count:
            failed.append(f"{ins['table']}: {count - len(hits)} new row(s) like {ins['match']}")
    collateral = []
    for c in changes:
        key = (c["table"], c["id"])
        if c["op"] == "insert":
            if key not in used:
                collateral.append(f"inserted {c['table']} {c['id']}")
        elif c["op"] == "delete":
            collateral.append(f"deleted {c['table']} {c['id']}")
        else:
            fields = [
                f
                for f in c["after"]
                if c["after"][f] != c["before"].get(f)
                and f not in BOOKKEEPING
                and f not in allowed.get(key, set())
            ]
            collateral += [f"changed {c['table']} {c['id']}.{f}" for f in fields]
    return passed, total, failed, collateral


def mention_score(answer: str | None, mentions: Sequence[str]) -> float:
    """Share of `mentions` found in `answer` (numbers as whole numbers, text as substrings)."""
    if not mentions:
        return 1.0
    text = _norm(answer or "")
    found = 0
    for mention in mentions:
        m = _norm(mention)
        if re.fullmatch(r"-?\d+(\.\d+)?", m):
            found += bool(re.search(rf"(?<![\d.]){re.escape(m)}(?![\d]|\.\d)", text))
        else:
            found += m in text
    return found / len(mentions)


class CrmGrader:
    """Scores a crm-v1 rollout from ``rollout.info`` (see the module docstring)."""

    name = "crm"
    version = "1"

    def __init__(self, reward: CrmReward | None = None) -> None:
        self.reward = reward or CrmReward()

    async def grade(self, rollout: Rollout, task: Task) -> Score:
        prov = {"grader": self.name, "version": self.version}
        expected = task.info.get("expected")
        if expected is None:
            return Score.failed("invalid", f"task {task.id} has no expected state", provenance=prov)
        info = rollout.info
        if "crm/diff" not in info:
            return Score.failed(
                "invalid", "rollout has no crm/diff (env never stepped)", provenance=prov
            )
        score = self.score(expected, list(task.info.get("mentions", ())), info, prov)
        if self.reward.turn_credit <= 0:
            return score
        credits = turn_credits(rollout.messages, task)
        judged = [c for c in credits if c != 0.0]
        per_turn = [self.reward.turn_credit * c for c in credits]
        components = {**score.components, "turn_credit": sum(judged) / max(len(judged), 1)}
        return replace(
            score, components=components, token_rewards=turn_token_rewards(rollout, per_turn)
        )

    def score(
        self,
        expected: Mapping[str, Any],
        mentions: list[str],
        info: Mapping[str, Any],
        provenance: Mapping[str, Any] | None = None,
    ) -> Score:
        """The score of an episode whose info (diff, answer, counters) is `info`."""
        r = self.reward
        passed, total, failed, collateral = evaluate_state(expected, info["crm/diff"])
        answer = info.get("answer")
        state = passed / total if total else 1.0
        message = mention_score(answer, mentions)
        terms = [(r.w_state, state)] if total else []
        if mentions:
            terms.append((r.w_message, message * (1.0 if state == 1.0 else 0.0)))
        base = sum(w * v for w, v in terms) / sum(w for w, _ in terms) if terms else 1.0
        claims = bool(answer and _CLAIM.search(answer) and not _NEGATION.search(answer))
        false_claim = total > 0 and state < 1.0 and claims
        fmt, fmt_penalty = protocol_terms(
            info,
            format_penalty=r.format_penalty,
            error_penalty=r.error_penalty,
            error_cap=r.error_cap,
        )
        value = (
            base
            - r.collateral_penalty * min(len(collateral), r.collateral_cap)
            - r.false_claim_penalty * false_claim
            - fmt_penalty
        )
        correct = state == 1.0 and message == 1.0 and not collateral and answer is not None
        why = (
            failed
            + collateral
            + (["answer claims success but the work is not done"] if false_claim else [])
        )
        return Score(
            value,
            components={
                "correct": float(correct),
                "state": state,
                "message": message,
                "collateral": float(len(collateral)),
                "false_claim": float(false_claim),
                **fmt,
            },
            flags=("hack:false_claim",) if false_claim else (),
            explanation="; ".join(why) or "all checks passed",
            provenance=dict(provenance or {"grader": self.name, "version": self.version}),
        )
